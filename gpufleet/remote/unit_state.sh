#!/bin/bash
# A systemd unit's ActiveState, SubState, NRestarts, MainPID, and Age= seconds since it last became active.
# Args: $1 the unit.
systemctl show -p ActiveState -p SubState -p NRestarts -p MainPID -- "$1"
ts=$(systemctl show -p ActiveEnterTimestamp --value -- "$1")
if [ -n "$ts" ] && when=$(date -d "$ts" +%s 2>/dev/null); then echo "Age=$(( $(date +%s) - when ))"; fi
