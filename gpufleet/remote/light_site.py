"""sys.path as `site` builds it, without running the .pth files' import lines: for host reads run with `python -S`.

A venv's .pth import lines load code at every start (setuptools' editable finder for an editable sglang,
distutils-precedence): about 10 ms of a simulated host's CPU, half of such a read. They install finders; they add no
directory a read lists (an editable finder appends a placeholder entry that names none). `begin()` builds sys.path
with them held back; `finish()` runs site again from the bare path, import lines included, as a normal start does,
for a read that goes on to import the stack. Both do nothing when site already ran (no -S). Stdlib only, 3.8+.
"""

import sys

_bare = None  # sys.path before begin() ran site; None when begin() held nothing back


def _held_back(*args, **kwargs):
    return None


def begin():
    """Under -S: run site with each .pth import line held back (site runs them with exec(), looked up in its own
    globals first). Should that fail, site runs in full."""
    global _bare
    if not sys.flags.no_site or _bare is not None:
        return
    import site

    _bare = list(sys.path)
    site.exec = _held_back
    try:
        site.main()
    except Exception:  # noqa: BLE001 - a site this does not know: the normal start instead
        del site.exec
        sys.path[:], _bare = _bare, None
        site.main()
        return
    del site.exec


def finish():
    """After begin(): site again from the bare sys.path, import lines included, as at a normal start."""
    global _bare
    if _bare is None:
        return
    import site

    sys.path[:], _bare = _bare, None
    site.main()
