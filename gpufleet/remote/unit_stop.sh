#!/bin/bash
# Stop a systemd unit and prove it gone: not active, no main pid.
# Args: $1 the unit.
unit=$1
systemctl stop -- "$unit" 2>/dev/null
systemctl reset-failed -- "$unit" 2>/dev/null
state=$(systemctl show -p ActiveState --value -- "$unit" 2>/dev/null)
pid=$(systemctl show -p MainPID --value -- "$unit" 2>/dev/null)
case "$state" in active|activating|deactivating|reloading) echo "$unit is still $state (pid $pid)"; exit 1;; esac
[ "${pid:-0}" = 0 ] || { echo "$unit still has main pid $pid"; exit 1; }
echo "$unit stopped"
