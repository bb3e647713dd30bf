#!/bin/bash
# The model server's state for planning: env file sha256 and mode, the kernel record's sha256, whether systemd
# wants a daemon-reload, the stack record, then `@@unit present|absent` and the unit file's text.
# Args: $1 unit file, $2 env file, $3 stack record, $4 kernel record, $5 unit name.
unit=$1 env=$2 record=$3 kernel=$4 name=$5
[ -f "$env" ] && echo "env_sha=$(sha256sum < "$env" | cut -d ' ' -f 1)" && echo "env_mode=$(stat -c %a -- "$env")"
[ -f "$kernel" ] && echo "kernel_sha=$(sha256sum < "$kernel" | cut -d ' ' -f 1)"
command -v systemctl >/dev/null && echo "need_reload=$(systemctl show -p NeedDaemonReload --value -- "$name" 2>/dev/null)"
[ -f "$record" ] && echo "record=$(tr -d '\n' < "$record")"
if [ -f "$unit" ]; then echo "@@unit present"; cat -- "$unit"; else echo "@@unit absent"; fi
