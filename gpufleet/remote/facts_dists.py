# gpufleet facts: the venv's Python version, then its installed distributions, read from their metadata directories
# (what `pip list --format=json` answers, without pip's ~0.3 s of imports). Run by the venv's own python with
# `python -S -c`, from `/`, no arguments (start_site builds sys.path). Prints the version (`3.12.3`), the
# `@@gpufleet-section packages rc=0@@` header, then one JSON line shaped like pip's:
# [{"name": ..., "version": ...[, "editable_project_location": ...]}].
# Stdlib only, Python 3.8+. Mirrors pip's importlib backend: sys.path in order (site's .pth files included), every
# `*.dist-info` / `*.egg-info` (directory or file) and a path entry that is itself an `.egg`, then `*.egg-link`
# targets; the first of a name (canonicalised from the directory's name) wins; names that are not valid project
# names (`~orch.dist-info`, a pip leftover) are skipped; versions in PEP 440 normal form (pip prints
# str(Version)); editable: direct_url.json's local `dir_info.editable`, else a `<name>.egg-link` on sys.path.
# Not read: zipped eggs and zip files on sys.path (pip reaches zipped eggs only through its deprecated
# pkg_resources path; pip and uv install none). pip 26 differs from pip 24 on two broken cases: it lists a
# dist-info without METADATA and prefers the version in a dist-info's directory name; this follows pip 24.
import os
import sys

# The common case imports neither json nor re (~8 ms of a host's CPU on every status, a third of this script): names,
# versions and the JSON line take plain string code, and only a rare input (a version not in normal form, text
# that needs escaping, a direct_url.json) imports the module that answers it exactly.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
# packaging's VERSION_PATTERN, for the rare version not already in normal form
_PEP440 = r"""v?(?:(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_\.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_\.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_\.]?(?P<post_l>post|rev|r)[-_\.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_\.]?(?P<dev_l>dev)[-_\.]?(?P<dev_n>[0-9]+)?)?)(?:\+(?P<local>[a-z0-9]+(?:[-_\.][a-z0-9]+)*))?"""
_PRE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}


def canonical(name):
    """PEP 503's name: runs of -_. become one -, lower case (re.sub(r"[-_.]+", "-", name).lower())."""
    name = name.replace("_", "-").replace(".", "-").lower()
    while "--" in name:
        name = name.replace("--", "-")
    return name


def valid(name):
    """A valid project name: ASCII letters, digits and -_., starting and ending with a letter or digit."""
    return bool(name) and name[0] in _ALNUM and name[-1] in _ALNUM and _NAME_CHARS.issuperset(name)


def _number(text):
    return text.isdigit() and text.isascii() and (text == "0" or text[0] != "0")


def is_normal(text):
    """True only if str(packaging.version.Version(text)) == text, for the shapes installed versions take (N.N...,
    aN/bN/rcN on the last release part, .postN, .devN, +local with a letter in each part); False sends the
    rest to normal_version's full parse, so False is always safe."""
    public, plus, local = text.partition("+")
    if plus and not all(p.isascii() and p.isalnum() and p == p.lower() and not p.isdigit() for p in local.split(".")):
        return False
    parts = public.split(".")
    for suffix in ("dev", "post"):  # in this order from the end: N.N.postN.devN
        if len(parts) > 1 and parts[-1].startswith(suffix) and _number(parts[-1][len(suffix):]):
            parts.pop()
    last = parts[-1]
    digits = len(last) - len(last.lstrip("0123456789"))
    if digits < len(last):
        for pre in ("rc", "a", "b"):
            if last[digits:].startswith(pre):
                if not _number(last[digits + len(pre):]):
                    return False
                break
        else:
            return False
        parts[-1] = last[:digits]
    return all(_number(p) for p in parts)


def normal_version(text):
    """str(packaging.version.Version(text)); the text unchanged when it is no PEP 440 version (pip 24.0's
    LegacyVersion prints it so)."""
    text = text.strip()
    if is_normal(text):
        return text
    import re
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


def quoted(text):
    """json.dumps(text): printable ASCII without a quote or backslash as it is, anything else through json."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    import json
    return json.dumps(text)


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
                        if len(found) == 2:
                            break  # both come near the top; the dependency lists after them are not needed
            return found
        except (OSError, UnicodeDecodeError):
            continue
    return found


def listed(location):
    """The names in one sys.path entry (or an egg-link's target); None where it is no readable directory."""
    try:
        return os.listdir(location or ".")
    except OSError:
        return None


def found_in(location, children):
    """(stem name, metadata path) of each distribution importlib.metadata finds in one directory's listing."""
    if not children:
        return []
    infos = [(c.rpartition(".")[0].partition("-")[0], os.path.join(location, c))
             for c in children if c.lower().endswith((".dist-info", ".egg-info"))]
    if location.lower().endswith(".egg") and "EGG-INFO" in children:
        infos.append((os.path.basename(location).partition("-")[0], os.path.join(location, "EGG-INFO")))
    return infos


def linked(location, children):
    """The target directories of the `.egg-link` files in a sys.path entry (the first non-blank line of each)."""
    targets = []
    for child in children or ():
        if child.endswith(".egg-link"):
            try:
                with open(os.path.join(location, child)) as handle:
                    target = next((line.strip() for line in handle if line.strip()), "")
            except OSError:
                continue
            if target:
                targets.append(os.path.join(location, target))
    return targets


def safe_name(name):
    """The egg-link's name for a project: runs of anything but ASCII letters, digits and `.` become one `-`."""
    out, run = [], False
    for ch in name:
        if ch in _ALNUM or ch == ".":
            out.append(ch)
            run = False
        elif not run:
            out.append("-")
            run = True
    return "".join(out)


# direct_url.json for an editable install from a directory, as pip (json.dumps, sorted keys) and uv write it
_EDITABLE_FORMS = (('{"dir_info": {"editable": true}, "url": "', '"}'), ('{"url":"', '","dir_info":{"editable":true}}'))


def egg_linked(info, raw_name, listings):
    """The project directory holding the egg-info when a `<name>.egg-link` is on sys.path (`setup.py develop`).
    listings: each sys.path entry's names, read once (was a stat per entry and name for every distribution)."""
    names = (safe_name(raw_name) + ".egg-link", raw_name + ".egg-link")
    for entry, children in listings:
        if children and any(name in children and os.path.isfile(os.path.join(entry, name)) for name in names):
            return os.path.dirname(info)
    return None


def file_path(url):
    """unquote(urlsplit(url).path) for a file: URL on this host (netloc empty or localhost), else None. Only a URL
    with %, ?, # or an unprintable character needs urllib (~8 ms of imports)."""
    for head in ("file:///", "file://localhost/"):
        if url.startswith(head) and url.isprintable() and not any(c in url for c in "%?#"):
            return url[len(head) - 1:]
    from urllib.parse import unquote, urlsplit  # not urllib.request (url2pathname): 40 ms of imports
    parts = urlsplit(url)
    return unquote(parts.path) if parts.netloc in ("", "localhost") else None


def editable_location(info, raw_name, listings):
    """pip's editable_project_location: a local editable direct_url.json, else a `<name>.egg-link` on sys.path.
    The two shapes an editable install writes are read as they are, and a file that cannot say editable (no
    `"editable"`, no escape) needs no parse unless an egg-link would answer for an unreadable one; anything else
    goes through json (json and re: ~8 ms of imports)."""
    try:
        with open(os.path.join(info, "direct_url.json")) as handle:
            text = handle.read()
    except OSError:
        return egg_linked(info, raw_name, listings)
    if "\\" not in text:
        stripped = text.strip(" \t\n\r")  # what JSON counts as whitespace, no more
        for head, tail in _EDITABLE_FORMS:
            url = stripped[len(head):len(stripped) - len(tail)]
            if (len(stripped) >= len(head) + len(tail) and stripped.startswith(head) and stripped.endswith(tail)
                    and '"' not in url and url.isprintable()):
                return file_path(url) if url.startswith("file:") else None
        if '"editable"' not in text and egg_linked(info, raw_name, listings) is None:
            return None  # not editable; and were the JSON unsound, no egg-link would answer either
    import json
    try:
        direct = json.loads(text)
    except ValueError:
        direct = None
    if isinstance(direct, dict) and isinstance(direct.get("url"), str):
        dir_info = direct.get("dir_info")
        if isinstance(dir_info, dict) and dir_info.get("editable") is True and direct["url"].startswith("file:"):
            return file_path(direct["url"])
        return None
    return egg_linked(info, raw_name, listings)


# .pth files whose import lines only put an import hook on sys.meta_path (read in their sources): setuptools'
# distutils shim, virtualenv's distutils patch, numba-cuda's numba.cuda redirector (on the real H200 venv: ~40 ms
# of imports at every start, python -S -c pass 9 ms against 52 ms)
_HOOKS_ONLY = ("distutils-precedence.pth", "_virtualenv.pth", "_numba_cuda_redirector.pth")


def held_back(name):
    """A .pth file whose import lines add no directory a listing reads: one of _HOOKS_ONLY, or an editable
    install's __editable__.*.pth (setuptools' finder; it may append a placeholder entry that names no directory).
    Their path lines are still read."""
    return name in _HOOKS_ONLY or (name.startswith("__editable__.") and name.endswith(".pth"))


def start_site():
    """Under -S (as the facts script starts this): site's sys.path as a normal start builds it, each .pth file
    read as site reads it, except the import lines of the files held_back() names. Without -S: nothing to do."""
    if not sys.flags.no_site:
        return
    import site

    original = site.addpackage

    def addpackage(sitedir, name, known_paths):
        if not held_back(name):
            return original(sitedir, name, known_paths)
        site.exec = lambda *args, **kwargs: None  # addpackage runs import lines with exec(), found in site's globals
        try:
            return original(sitedir, name, known_paths)
        finally:
            del site.exec

    site.addpackage = addpackage
    try:
        site.main()
    finally:
        site.addpackage = original


def distributions():
    """pip list's rows, in its order (by canonical name)."""
    # in listdir's order, as importlib.metadata finds them (of two directories of one name, the first wins)
    ordered = [(entry, listed(entry)) for entry in sys.path]
    listings = [(entry, set(children) if children is not None else None) for entry, children in ordered]
    seen, rows = set(), []
    for entry, children in ordered:
        if entry.endswith(".whl") and os.path.isfile(entry):
            continue  # pip never reads a wheel on sys.path as installed
        infos = found_in(entry, children)
        infos += [found for target in linked(entry, children) for found in found_in(target, listed(target))]
        for stem, info in infos:
            meta = headers(info)
            name = canonical(stem) or canonical(meta.get("Name") or "")
            if name in seen:
                continue
            seen.add(name)
            if not valid(name) or name in ("python", "wsgiref", "argparse"):
                continue  # pip's leftovers (`~orch.dist-info`) and its stdlib skip list
            if not meta.get("Name"):
                continue  # no METADATA (an interrupted install): pip 24 skips it ("invalid metadata entry 'name'")
            item = {"name": meta["Name"], "version": normal_version(meta.get("Version") or "")}
            where = editable_location(info, meta["Name"], listings)
            if where:
                item["editable_project_location"] = where
            rows.append((name, item))
    return [item for name, item in sorted(rows, key=lambda pair: pair[0])]


def as_json(rows):
    """json.dumps(rows) for a list of flat dicts of strings, byte for byte."""
    return "[" + ", ".join("{" + ", ".join(quoted(k) + ": " + quoted(v) for k, v in row.items()) + "}"
                           for row in rows) + "]"


if __name__ == "__main__":
    start_site()
    print(sys.version.split()[0])
    print("@@gpufleet-section packages rc=0@@")
    print(as_json(distributions()))
