"""Is there room for what a step will write? Sums the needs per filesystem and compares with the free space there.

    python3 -c "$(cat disk_room.py)" CHECKS_JSON

CHECKS_JSON: a list of {"path": where it will be written, "need": bytes known on the control node, "what": a
phrase, "unpack": [wheel files on this host whose unpacked size adds to the need]}. A path that does not exist yet
counts for its nearest existing parent. Prints one line per filesystem: `room DEVICE need=N free=F what=...`; exits
3 with a sentence naming the path, the need and the free space when one has too little, 0 otherwise. Runs with the
host's python3 (stdlib only); never imports gpufleet.
"""

import json
import os
import sys
import zipfile

MARGIN = 64 * 2**20  # never fill a filesystem to the last block: the server and pip need room to breathe


def existing(path):
    while path and not os.path.exists(path):
        parent = os.path.dirname(path.rstrip("/")) or "/"
        if parent == path:
            break
        path = parent
    return path or "/"


def unpacked(wheel):
    """What a wheel takes once installed: the sum of its members' sizes, read from the zip's directory only."""
    with zipfile.ZipFile(wheel) as z:
        return sum(info.file_size for info in z.infolist())


def mib(n):
    return "%.0f MiB" % (n / 2**20) if n < 10 * 2**30 else "%.1f GiB" % (n / 2**30)


def main(argv):
    checks = json.loads(argv[1])
    per_fs = {}
    for check in checks:
        where = existing(check["path"])
        dev = os.stat(where).st_dev
        need = int(check.get("need", 0))
        for wheel in check.get("unpack", []):
            try:
                need += unpacked(wheel)
            except (OSError, zipfile.BadZipFile) as exc:
                print("cannot read %s to size it: %s" % (wheel, exc))
                return 2
        entry = per_fs.setdefault(dev, {"where": where, "need": 0, "what": [], "paths": []})
        entry["need"] += need
        entry["what"].append("%s %s" % (check.get("what", "files"), mib(need)))
        entry["paths"].append(check["path"])
    short = None
    for dev, entry in per_fs.items():
        st = os.statvfs(entry["where"])
        free = st.f_bavail * st.f_frsize
        print("room %d need=%d free=%d what=%s" % (dev, entry["need"], free, "; ".join(entry["what"])))
        if free < entry["need"] + MARGIN and short is None:
            short = (entry, free)
    if short:
        entry, free = short
        print("too little disk for %s: it needs %s (%s) plus a %s margin, and %s is free there"
              % (" and ".join(sorted(set(entry["paths"]))), mib(entry["need"]), "; ".join(entry["what"]), mib(MARGIN),
                 mib(free)))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
