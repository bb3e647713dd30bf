"""OpenSSH's own files read as OpenSSH reads them: ssh_config with Include; known_hosts with hashed names, patterns,
@revoked keys and @cert-authority lines whose host certificates are checked here (paramiko checks none)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

# ssh_config's Include expansion lives in sshconfig.py (read there before paramiko is imported); named here too
from gpufleet.engine.sshconfig import expand_includes  # noqa: F401
from gpufleet.errors import HostKeyError

GLOBAL_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
CERT_SUFFIX = "-cert-v01@openssh.com"
_HOST_CERT = 2


# --- known_hosts ------------------------------------------------------------------------------------------------

def host_name(address: str, port: int | None) -> str:
    """How known_hosts names a host: the bare name on port 22, `[name]:port` otherwise."""
    return address if not port or port == 22 else f"[{address}]:{port}"


@dataclass(frozen=True)
class Entry:
    """One known_hosts line: its marker (None, '@revoked', '@cert-authority'), host patterns, key and origin."""
    marker: str | None
    hosts: str
    key: paramiko.PKey
    origin: str  # "file:line"

    def names(self, name: str) -> bool:
        """Whether this line's host field names `name` (hashed `|1|salt|hash`, or patterns with * ? and !)."""
        if self.hosts.startswith("|1|"):
            try:
                _, _, salt, digest = self.hosts.split("|", 3)
                mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
            except (ValueError, TypeError):
                return False
            return hmac.compare_digest(base64.b64encode(mac).decode(), digest)
        matched = False
        for pattern in self.hosts.split(","):
            negated = pattern.startswith("!")
            if _wildcard(pattern.lstrip("!")).fullmatch(name.lower()):
                if negated:
                    return False
                matched = True
        return matched


def _wildcard(pattern: str) -> re.Pattern:
    """OpenSSH's host patterns: only * and ? are special (`[host]:port` is literal, unlike fnmatch's classes)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()))


def fingerprint(key: paramiko.PKey) -> str:
    """A key as OpenSSH shows it: its type and `SHA256:` + the unpadded base64 of the SHA-256 of its blob."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


def _same(a: paramiko.PKey, b: paramiko.PKey) -> bool:
    return a.get_name().removesuffix(CERT_SUFFIX) == b.get_name().removesuffix(CERT_SUFFIX) and \
        a.asbytes() == b.asbytes()


class KnownHosts:
    """Every usable line of the known_hosts files (the user's, then /etc/ssh/ssh_known_hosts), in order."""

    def __init__(self, entries: list[Entry], files: list[Path]):
        self.entries = entries
        self.files = files

    @classmethod
    def load(cls, paths: list[Path]) -> "KnownHosts":
        entries: list[Entry] = []
        for path in paths:
            if not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                entry = _parse_line(line, f"{path}:{number}")
                if entry is not None:
                    entries.append(entry)
        return cls(entries, list(paths))

    def check(self, host: str, names: list[str], key: paramiko.PKey) -> bool:
        """True when the key is known for one of the names (directly or by a valid host certificate); False when
        nothing is known of it; HostKeyError when it is revoked, changed, or its certificate is not good."""
        plain = _plain_key(key)
        for entry in self.entries:
            if entry.marker == "@revoked" and _same(entry.key, plain):
                raise HostKeyError(f"host {host}: its host key {fingerprint(plain)} is REVOKED "
                                   f"({entry.origin}): refusing to connect")
        if key.public_blob is not None and key.public_blob.key_type.endswith(CERT_SUFFIX):
            return self._check_certificate(host, names, key)
        mine = [e for e in self.entries if e.marker is None and any(e.names(n) for n in names)]
        if any(_same(e.key, plain) for e in mine):
            return True
        changed = [e for e in mine if e.key.get_name() == plain.get_name()]
        if changed:
            known_file, _ = changed[0].origin.rsplit(":", 1)
            raise HostKeyError(
                f"host {host}: its host key CHANGED from {fingerprint(changed[0].key)} (known for {names[0]} in "
                f"{changed[0].origin}) to {fingerprint(plain)}: refusing to connect; if the box was "
                f"reinstalled, check the new key out of band, then remove the old one "
                f"(ssh-keygen -f {shlex.quote(known_file)} -R {shlex.quote(names[0])})")
        return False

    def authorities(self, names: list[str]) -> list[Entry]:
        """The @cert-authority lines that vouch for one of the names."""
        return [e for e in self.entries if e.marker == "@cert-authority" and any(e.names(n) for n in names)]

    def _check_certificate(self, host: str, names: list[str], key: paramiko.PKey) -> bool:
        cert = _parse_certificate(key.public_blob.key_blob)
        problem = None
        if cert["type"] != _HOST_CERT:
            problem = "it is not a host certificate"
        elif cert["principals"] and not any(n.split("]")[0].lstrip("[") in cert["principals"] for n in names):
            problem = f"it is for {', '.join(cert['principals'])}, not {names[0]}"
        elif not cert["valid_after"] <= time.time() < cert["valid_before"]:
            problem = "it is expired or not yet valid"
        signer = paramiko.PKey.from_type_string(_key_type(cert["ca"]), cert["ca"])
        authorities = self.authorities(names)
        vouching = [e for e in authorities if _same(e.key, signer)]
        if problem is None and not vouching:
            problem = ("its signing key is not an @cert-authority for this host in "
                       f"{', '.join(str(f) for f in self.files)}")
        if problem is None and not signer.verify_ssh_sig(cert["signed"], paramiko.Message(cert["signature"])):
            problem = "its signature does not verify"
        if problem:
            raise HostKeyError(f"host {host}: its host certificate ({cert['key_id']!r}) is refused: {problem}")
        return True


def _parse_line(line: str, origin: str) -> Entry | None:
    words = line.split()
    if not words or words[0].startswith("#"):
        return None
    marker = None
    if words[0].startswith("@"):
        marker, words = words[0], words[1:]
        if marker not in ("@revoked", "@cert-authority"):
            return None  # OpenSSH skips a line with a marker it does not know
    if len(words) < 3:
        return None
    try:
        key = paramiko.PKey.from_type_string(words[1], base64.b64decode(words[2]))
    except Exception:  # a key type paramiko cannot read: OpenSSH would skip it too when it cannot use it
        return None
    return Entry(marker, words[0], key, origin)


def _plain_key(key: paramiko.PKey) -> paramiko.PKey:
    """The public key itself, also when the host presented it inside a certificate."""
    blob = key.public_blob
    if blob is None or not blob.key_type.endswith(CERT_SUFFIX):
        return key
    cert = _parse_certificate(blob.key_blob)
    return paramiko.PKey.from_type_string(cert["plain_type"], cert["plain"])


def _key_type(blob: bytes) -> str:
    return paramiko.Message(blob).get_text()


_PUBLIC_FIELDS = {"ssh-ed25519": ("string",), "ssh-rsa": ("mpint", "mpint"),
                  "ecdsa-sha2-nistp256": ("string", "string"), "ecdsa-sha2-nistp384": ("string", "string"),
                  "ecdsa-sha2-nistp521": ("string", "string")}


def _parse_certificate(blob: bytes) -> dict:
    """An OpenSSH certificate (PROTOCOL.certkeys): the plain key it certifies, its fields, what the CA signed."""
    msg = paramiko.Message(blob)
    cert_type = msg.get_text()
    plain_type = cert_type.removesuffix(CERT_SUFFIX)
    msg.get_binary()  # nonce
    plain = paramiko.Message()
    plain.add_string(plain_type)
    for kind in _PUBLIC_FIELDS.get(plain_type, ()):
        if kind == "mpint":
            plain.add_mpint(msg.get_mpint())
        else:
            plain.add_string(msg.get_binary())
    if plain_type not in _PUBLIC_FIELDS:
        raise HostKeyError(f"a host certificate of type {cert_type} cannot be checked")
    fields = {"plain_type": plain_type, "plain": plain.asbytes(), "serial": msg.get_int64(), "type": msg.get_int()}
    fields["key_id"] = msg.get_text()
    principals = paramiko.Message(msg.get_binary())
    fields["principals"] = []
    while principals.get_remainder():
        fields["principals"].append(principals.get_text())
    fields["valid_after"], fields["valid_before"] = msg.get_int64(), msg.get_int64()
    msg.get_binary()  # critical options
    msg.get_binary()  # extensions
    msg.get_binary()  # reserved
    fields["ca"] = msg.get_binary()
    fields["signed"] = blob[: msg.packet.tell()]
    fields["signature"] = msg.get_binary()
    return fields


# --- the policy ---------------------------------------------------------------------------------------------------

class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key is judged here (the client is given no keys of its own): known, revoked, changed or
    certified by KnownHosts; a key never seen is refused, or recorded under OpenSSH's accept-new (and accepted
    without record under `StrictHostKeyChecking no`)."""

    def __init__(self, known: KnownHosts, names: list[str], *, strict: str, record: Path, host: str):
        self.known, self.names, self.strict, self.record, self.host = known, names, strict, record, host

    def missing_host_key(self, client, hostname, key):
        if self.known.check(self.host, self.names, key):
            return
        plain = _plain_key(key)
        if self.strict == "no":
            return
        if self.strict == "accept-new":
            self.record.parent.mkdir(parents=True, exist_ok=True)
            with open(self.record, "a") as f:
                f.write(f"{self.names[0]} {plain.get_name()} {plain.get_base64()}\n")
            return
        raise HostKeyError(
            f"host key of {self.names[0]} is not in {', '.join(str(f) for f in self.known.files)} "
            f"({fingerprint(plain)}): refusing to connect. Check the key out of band, then add it "
            f"(ssh-keyscan) or run once with --accept-new-host-keys")


def preferred_key_types(certified: bool) -> list[str]:
    """Host key algorithms to offer: certificate forms first when an @cert-authority vouches for the host."""
    plain = list(paramiko.Transport._preferred_keys)
    return [t + CERT_SUFFIX for t in plain] + plain if certified else plain
