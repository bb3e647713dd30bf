#!/bin/bash
# Whether a systemd unit's file is installed (`installed` or `absent`), then its active state; always exits 0.
# Args: $1 the unit.
systemctl cat -- "$1" >/dev/null 2>&1 && echo installed || echo absent; systemctl is-active -- "$1" 2>/dev/null; true
