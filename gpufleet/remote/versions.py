"""One version rule for the control node and the hosts: stdlib only, shipped to hosts ahead of the checks using it.

pip reports some wheels (torch) without the +cuXXX local label their file carries, and a stack pin may leave out
the label torch.__version__ reports: the side without a label is compared on the public part. Both sides are
expected in PEP 440 normal form (installed metadata is; the control node normalises the stack's pins).
"""


def covers(plain, full):
    """`plain` is `full`, or `full` without its local label."""
    return plain == full or ("+" not in plain and plain == full.split("+", 1)[0])


def versions_match(installed, wanted):
    """The installed version (None: not installed) is the wanted one."""
    return bool(installed) and covers(installed, wanted)
