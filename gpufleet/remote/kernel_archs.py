#!/usr/bin/env python3
"""Which GPU architectures a built CUDA library really contains.

Standalone, standard library only, Python 3.8+: gpufleet sends this file to a host and runs it with the host's
python (``python - ARGS`` with the script on stdin); it never imports gpufleet.

    kernel_archs.py [--cuobjdump PATH] LIB_OR_DIR...

For each library (a file as given; a directory: every ``*.so`` below it, sorted) one entry of the JSON document
printed on stdout::

    {"libraries": [{"path": "...", "archs": ["sm_90a", "sm_120a"], "ptx": ["compute_120a"],
                    "method": "cuobjdump" | "fatbin", "error": null}]}

``archs``: the cubins (device ELF files) the library carries, ``ptx``: its PTX, both deduplicated and sorted by SM
number. The names are cuobjdump's: ``cuobjdump --list-elf`` names a family cubin (``-arch sm_100f``) ``sm_100``,
``--list-ptx`` names family PTX ``sm_100f`` (here ``compute_100f``); the fatbin reader gives exactly the same.

cuobjdump is ``--cuobjdump PATH`` when given (and nothing else: ``--cuobjdump /nonexistent`` forces the fatbin
reader), else the first of ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin`` and ``PATH`` that has it. When there is none,
or it fails on a library, the library's ELF ``.nv_fatbin`` section is read directly (headers only, never
decompressed). Layout, verified against cuobjdump 13.0 / 13.5 on nvcc 13.0 output (tests/fixtures/kernel-archs):

* fatbin container: ``<IHHQ`` magic 0xBA55ED50, version, header size (16), size of the entries that follow;
  containers follow each other (8-byte aligned) until the end of the section.
* entry: ``<HHIQIIHHIIIQ`` kind (1 PTX, 2 ELF cubin, 8 LTO IR, ignored), version, header size, payload size,
  compressed size, ..., SM number (``90``), ..., flags; the next entry starts at header size + payload size.
* flags: 0x100000 arch-specific (the ``a`` of ``sm_90a``), 0x200000 family (the ``f`` of ``sm_100f``), 0x8000
  compressed payload. The cubin's own ELF ``e_flags`` do not tell ``sm_90`` from ``sm_90a`` (and a compressed cubin
  cannot be looked at without decompressing), so the entry flags are the only place the suffix is read from.

Exit status 0 whenever the JSON document was written (a library that could not be read has ``error`` set), 2 on a
usage error.
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")  # a shared library / executable; a relocatable -rdc object
KIND_PTX = 1
KIND_ELF = 2
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a
FLAG_FAMILY = 0x200000  # sm_100f
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQ")  # kind, version, header_size, size, ..., arch, ..., flags
_SECTION = struct.Struct("<IIQQQQIIQQ")
SHT_NOBITS = 8
CUOBJDUMP_TIMEOUT_S = 900

_ELF_LINE = re.compile(r"^ELF file\s+\d+:\s+(?:.*\.)?sm_(\d+)([a-z]?)\.cubin\s*$")
_PTX_LINE = re.compile(r"^PTX file\s+\d+:\s+(?:.*\.)?sm_(\d+)([a-z]?)\.ptx\s*$")


class FatbinError(Exception):
    """A library whose fatbin could not be read; the message says why, for the ``error`` field."""


def arch_key(name):
    """Sort key: by SM number, then suffix (``sm_90`` < ``sm_90a`` < ``sm_100``)."""
    m = re.match(r"^[a-z]+_(\d+)([a-z]*)$", name)
    if not m:
        return (1 << 30, name)
    return (int(m.group(1)), m.group(2))


def _sorted(names):
    return sorted(set(names), key=arch_key)


def parse_cuobjdump_listing(text):
    """``cuobjdump --list-elf`` and/or ``--list-ptx`` output -> (archs, ptx), deduplicated and sorted.

    ``ELF file    1: common_ops.abi3.1.sm_120a.cubin`` -> ``sm_120a``; ``PTX file    1: x.1.sm_90a.ptx`` ->
    ``compute_90a``; anything else (``cuobjdump info    : No PTX file found ...``) is ignored."""
    archs, ptx = [], []
    for line in text.splitlines():
        line = line.strip()
        m = _ELF_LINE.match(line)
        if m:
            archs.append("sm_%s%s" % (m.group(1), m.group(2)))
            continue
        m = _PTX_LINE.match(line)
        if m:
            ptx.append("compute_%s%s" % (m.group(1), m.group(2)))
    return _sorted(archs), _sorted(ptx)


def find_cuobjdump(explicit=None, environ=None):
    """The cuobjdump to run, or None. ``explicit`` (``--cuobjdump``) is the only candidate when given."""
    def usable(p):
        return p if p and os.path.isfile(p) and os.access(p, os.X_OK) else None

    if explicit is not None:
        return usable(explicit)
    environ = os.environ if environ is None else environ
    candidates = []
    if environ.get("CUDA_HOME"):
        candidates.append(os.path.join(environ["CUDA_HOME"], "bin", "cuobjdump"))
    candidates.append("/usr/local/cuda/bin/cuobjdump")
    for c in candidates:
        if usable(c):
            return c
    return shutil.which("cuobjdump", path=environ.get("PATH", os.defpath))


def read_with_cuobjdump(path, cuobjdump):
    """(archs, ptx) from ``cuobjdump --list-elf --list-ptx``; None when cuobjdump fails on the file."""
    try:
        proc = subprocess.run(
            [cuobjdump, "--list-elf", "--list-ptx", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=CUOBJDUMP_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:  # "does not contain device code" (255), "Invalid fatbin header" (1), ...
        return None
    return parse_cuobjdump_listing(proc.stdout.decode("utf-8", "replace"))


def _read_at(f, offset, size, what):
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise FatbinError("truncated file: %s at offset %d needs %d bytes, file ends first" % (what, offset, size))
    return data


def fatbin_sections(f):
    """[(offset, size)] of the ELF's fatbin sections. Raises FatbinError for a non-ELF / unsupported ELF."""
    f.seek(0, os.SEEK_END)
    file_size = f.tell()
    if file_size < 64:
        raise FatbinError("not an ELF file (%d bytes)" % file_size)
    ident = _read_at(f, 0, 64, "ELF header")
    if ident[:4] != b"\x7fELF":
        raise FatbinError("not an ELF file (magic %r)" % ident[:4])
    if ident[4] != 2:
        raise FatbinError("not a 64-bit ELF file (EI_CLASS %d)" % ident[4])
    if ident[5] != 1:
        raise FatbinError("not a little-endian ELF file (EI_DATA %d)" % ident[5])
    shoff, = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if shoff == 0:
        raise FatbinError("ELF file has no section headers, so no .nv_fatbin section")
    if shentsize < _SECTION.size:
        raise FatbinError("ELF section header size %d is too small" % shentsize)
    first = _SECTION.unpack(_read_at(f, shoff, _SECTION.size, "ELF section header 0"))
    if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
        shnum = first[5]
    if shstrndx == 0xFFFF:  # SHN_XINDEX
        shstrndx = first[6]
    if shnum > 1 << 20 or shoff + shnum * shentsize > file_size:
        raise FatbinError("truncated file: %d ELF section headers at offset %d do not fit" % (shnum, shoff))
    table = _read_at(f, shoff, shnum * shentsize, "ELF section headers")
    headers = [_SECTION.unpack_from(table, i * shentsize) for i in range(shnum)]
    if shstrndx >= shnum:
        raise FatbinError("ELF section name table index %d out of range" % shstrndx)
    strtab = headers[shstrndx]
    if strtab[4] + strtab[5] > file_size:
        raise FatbinError("truncated file: ELF section name table runs past the end of the file")
    names = _read_at(f, strtab[4], strtab[5], "ELF section names")
    found = []
    for h in headers:
        end = names.find(b"\0", h[0])
        name = names[h[0]:end if end >= 0 else len(names)].decode("ascii", "replace")
        if name not in FATBIN_SECTIONS:
            continue
        if h[1] == SHT_NOBITS:
            raise FatbinError("%s section has no contents (SHT_NOBITS)" % name)
        if h[4] + h[5] > file_size:
            raise FatbinError(
                "truncated file: %s section (offset %d, %d bytes) runs past the end of the file (%d bytes)"
                % (name, h[4], h[5], file_size)
            )
        found.append((h[4], h[5]))
    if not found:
        raise FatbinError("ELF file has no .nv_fatbin section (no CUDA device code)")
    return found


def fatbin_entries(f, offset, size):
    """Yield (kind, sm, flags) of every entry of the fatbin containers in [offset, offset + size)."""
    pos = 0
    while pos < size:
        if size - pos < _CONTAINER.size:
            tail = _read_at(f, offset + pos, size - pos, "fatbin padding")
            if tail.strip(b"\0"):
                raise FatbinError("truncated fatbin: %d stray bytes at section offset %d" % (size - pos, pos))
            return
        head = _read_at(f, offset + pos, _CONTAINER.size, "fatbin header")
        if head[:8] == b"\0" * 8:  # alignment padding between containers
            pos += 8
            continue
        magic, _version, header_size, body_size = _CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC:
            raise FatbinError("bad fatbin magic 0x%08x at section offset %d (want 0x%08x)" % (magic, pos, FATBIN_MAGIC))
        if header_size < _CONTAINER.size:
            raise FatbinError("bad fatbin header size %d at section offset %d" % (header_size, pos))
        end = pos + header_size + body_size
        if end > size:
            raise FatbinError(
                "truncated fatbin: container at section offset %d claims %d bytes, the section has %d"
                % (pos, header_size + body_size, size - pos)
            )
        entry = pos + header_size
        while entry < end:
            if end - entry < _ENTRY.size:
                raise FatbinError("truncated fatbin: entry header at section offset %d is cut off" % entry)
            kind, _ver, entry_header, payload, _csize, _u, _minor, _major, sm, _noff, _nlen, flags = _ENTRY.unpack(
                _read_at(f, offset + entry, _ENTRY.size, "fatbin entry header")
            )
            if entry_header < _ENTRY.size or entry + entry_header + payload > end:
                raise FatbinError(
                    "truncated fatbin: entry at section offset %d (header %d, payload %d bytes) overruns its container"
                    % (entry, entry_header, payload)
                )
            yield kind, sm, flags
            entry += entry_header + payload
        pos = end


def read_fatbin(path):
    """(archs, ptx) read from the ELF's fatbin section(s), named as cuobjdump --list-elf / --list-ptx name them."""
    archs, ptx = [], []
    try:
        with open(path, "rb") as f:
            for offset, size in fatbin_sections(f):
                for kind, sm, flags in fatbin_entries(f, offset, size):
                    if kind == KIND_ELF:
                        # cuobjdump --list-elf names a family cubin without its "f"
                        archs.append("sm_%d%s" % (sm, "a" if flags & FLAG_ARCH_SPECIFIC else ""))
                    elif kind == KIND_PTX:
                        suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
                        ptx.append("compute_%d%s" % (sm, suffix))
    except OSError as e:
        raise FatbinError("cannot read: %s" % (e.strerror or e))
    return _sorted(archs), _sorted(ptx)


def library_report(path, cuobjdump=None):
    """One ``libraries`` entry; never raises for a bad library."""
    report = {"path": path, "archs": [], "ptx": [], "method": "fatbin", "error": None}
    if cuobjdump:
        got = read_with_cuobjdump(path, cuobjdump)
        if got is not None:
            report.update(archs=got[0], ptx=got[1], method="cuobjdump")
            return report
    if not os.path.exists(path):
        report["error"] = "no such file"
        return report
    try:
        report["archs"], report["ptx"] = read_fatbin(path)
    except FatbinError as e:
        report["error"] = str(e)
    except Exception as e:  # a layout this reader does not know must not cost the other libraries
        report["error"] = "unreadable fatbin: %s: %s" % (type(e).__name__, e)
    return report


def libraries(paths):
    """Files as given; for a directory, every *.so below it, sorted."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, _dirs, files in os.walk(p):
                found.extend(os.path.join(root, n) for n in files if n.endswith(".so"))
            out.extend(sorted(found))
        else:
            out.append(p)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="kernel_archs.py", description="List the GPU architectures (cubins, PTX) that CUDA libraries contain."
    )
    parser.add_argument(
        "--cuobjdump", metavar="PATH", help="the cuobjdump to use (only this one; missing: read the fatbin directly)"
    )
    parser.add_argument("paths", nargs="+", metavar="LIB_OR_DIR")
    args = parser.parse_args(argv)
    cuobjdump = find_cuobjdump(args.cuobjdump)
    doc = {"libraries": [library_report(p, cuobjdump) for p in libraries(args.paths)]}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
