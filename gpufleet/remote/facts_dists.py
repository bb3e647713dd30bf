# gpufleet facts: the venv's Python version, then its installed distributions, read from their metadata directories
# (what `pip list --format=json` answers, without pip's ~0.3 s of imports). Run by the venv's own python with
# `python -c`, from `/`, no arguments. Prints the version (`3.12.3`), the `@@gpufleet-section packages rc=0@@` header,
# then one JSON line shaped like pip's: [{"name": ..., "version": ...[, "editable_project_location": ...]}].
# Stdlib only, Python 3.8+. Mirrors pip's importlib backend: sys.path in order (site's .pth files included), every
# `*.dist-info` / `*.egg-info` (directory or file) and a path entry that is itself an `.egg`, then `*.egg-link`
# targets; the first of a name (canonicalised from the directory's name) wins; names that are not valid project
# names (`~orch.dist-info`, a pip leftover) are skipped; versions in PEP 440 normal form (pip prints
# str(Version)); editable: direct_url.json's local `dir_info.editable`, else a `<name>.egg-link` on sys.path.
# Not read: zipped eggs and zip files on sys.path (pip reaches zipped eggs only through its deprecated
# pkg_resources path; pip and uv install none). pip 26 differs from pip 24 on two broken cases: it lists a
# dist-info without METADATA and prefers the version in a dist-info's directory name; this follows pip 24.
import json
import os
import re
import sys

print(sys.version.split()[0])
print("@@gpufleet-section packages rc=0@@")

_VALID = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.I)
_NORMAL = re.compile(r"^(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?(\.post(0|[1-9][0-9]*))?"
                     r"(\.dev(0|[1-9][0-9]*))?(\+[a-z0-9]*[a-z][a-z0-9]*(\.[a-z0-9]*[a-z][a-z0-9]*)*)?$")
# packaging's VERSION_PATTERN, for the rare version not already in normal form
_PEP440 = r"""v?(?:(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_\.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_\.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_\.]?(?P<post_l>post|rev|r)[-_\.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_\.]?(?P<dev_l>dev)[-_\.]?(?P<dev_n>[0-9]+)?)?)(?:\+(?P<local>[a-z0-9]+(?:[-_\.][a-z0-9]+)*))?"""
_PRE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def normal_version(text):
    """str(packaging.version.Version(text)); the text unchanged when it is no PEP 440 version (pip 24.0's
    LegacyVersion prints it so)."""
    text = text.strip()
    if _NORMAL.match(text):
        return text
    m = re.match(r"^\s*" + _PEP440 + r"\s*$", text, re.VERBOSE | re.IGNORECASE)
    if not m:
        return text
    out = (m["epoch"] + "!" if m["epoch"] and int(m["epoch"]) else "")
    out += ".".join(str(int(p)) for p in m["release"].split("."))
    if m["pre"]:
        out += _PRE[m["pre_l"].lower()] + str(int(m["pre_n"] or 0))
    if m["post"]:
        out += ".post" + str(int(m["post_n1"] or m["post_n2"] or 0))
    if m["dev"]:
        out += ".dev" + str(int(m["dev_n"] or 0))
    if m["local"]:
        parts = re.split(r"[-_.]", m["local"].lower())
        out += "+" + ".".join(str(int(p)) if p.isdigit() else p for p in parts)
    return out


def headers(path):
    """Name and Version from a METADATA / PKG-INFO file (an egg-info may be that file itself); {} if unreadable."""
    found = {}
    for candidate in (os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO"), path):
        try:
            with open(candidate, encoding="utf-8", errors="surrogateescape") as handle:
                for line in handle:
                    if not line.strip():
                        break  # headers end at the first blank line; the long description follows
                    key, sep, value = line.partition(":")
                    if sep and key in ("Name", "Version") and key not in found:
                        found[key] = value.strip()
            return found
        except (OSError, UnicodeDecodeError):
            continue
    return found


def found_in(location):
    """(stem name, metadata path) of each distribution importlib.metadata finds in one sys.path entry."""
    try:
        children = os.listdir(location or ".")
    except OSError:
        return []
    infos = [(c.rpartition(".")[0].partition("-")[0], os.path.join(location, c))
             for c in children if c.lower().endswith((".dist-info", ".egg-info"))]
    if location.lower().endswith(".egg") and "EGG-INFO" in children:
        infos.append((os.path.basename(location).partition("-")[0], os.path.join(location, "EGG-INFO")))
    return infos


def linked(location):
    """The target directories of the `.egg-link` files in a sys.path entry (the first non-blank line of each)."""
    targets = []
    if not os.path.isdir(location or "."):
        return targets
    for child in os.listdir(location or "."):
        if child.endswith(".egg-link"):
            try:
                with open(os.path.join(location, child)) as handle:
                    target = next((line.strip() for line in handle if line.strip()), "")
            except OSError:
                continue
            if target:
                targets.append(os.path.join(location, target))
    return targets


def editable_location(info, raw_name):
    """pip's editable_project_location: a local editable direct_url.json, else a `<name>.egg-link` on sys.path."""
    try:
        with open(os.path.join(info, "direct_url.json")) as handle:
            direct = json.load(handle)
    except (OSError, ValueError):
        direct = None
    if isinstance(direct, dict) and isinstance(direct.get("url"), str):
        dir_info = direct.get("dir_info")
        if isinstance(dir_info, dict) and dir_info.get("editable") is True and direct["url"].startswith("file:"):
            from urllib.parse import unquote, urlsplit  # not urllib.request (url2pathname): 40 ms of imports
            parts = urlsplit(direct["url"])
            if parts.netloc in ("", "localhost"):
                return unquote(parts.path)
        return None
    names = (re.sub(r"[^A-Za-z0-9.]+", "-", raw_name) + ".egg-link", raw_name + ".egg-link")
    for entry in sys.path:
        if any(os.path.isfile(os.path.join(entry, name)) for name in names):
            return os.path.dirname(info)  # the project directory holding the egg-info
    return None


def distributions():
    seen, listed = set(), []
    for entry in sys.path:
        if entry.endswith(".whl") and os.path.isfile(entry):
            continue  # pip never reads a wheel on sys.path as installed
        infos = found_in(entry) + [found for target in linked(entry) for found in found_in(target)]
        for stem, info in infos:
            meta = headers(info)
            name = canonical(stem) or canonical(meta.get("Name") or "")
            if name in seen:
                continue
            seen.add(name)
            if not _VALID.match(name) or name in ("python", "wsgiref", "argparse"):
                continue  # pip's leftovers (`~orch.dist-info`) and its stdlib skip list
            if not meta.get("Name"):
                continue  # no METADATA (an interrupted install): pip 24 skips it ("invalid metadata entry 'name'")
            item = {"name": meta["Name"], "version": normal_version(meta.get("Version") or "")}
            where = editable_location(info, meta["Name"])
            if where:
                item["editable_project_location"] = where
            listed.append((name, item))
    return [item for name, item in sorted(listed, key=lambda pair: pair[0])]


print(json.dumps(distributions()))
