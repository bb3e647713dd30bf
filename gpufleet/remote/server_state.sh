#!/bin/bash
# The model server's state for planning: env file sha256 and mode, the kernel record's sha256, whether systemd
# wants a daemon-reload, the stack record, then `@@unit present|absent` and the unit file's text.
# Args: $1 unit file, $2 env file, $3 stack record, $4 kernel record, $5 unit name.
unit=$1 env=$2 record=$3 kernel=$4 name=$5
# bash's own reads and expansions where cut, tr and cat were: each process costs the host a millisecond or so
gf_sha() { local sum; sum=$(sha256sum <"$1") && printf '%s' "${sum%% *}"; }
gf_text() { gf_out=; IFS= read -r -d '' gf_out <"$1" || true; }  # read -d '' ends at the end of the file: not a failure
[ -f "$env" ] && echo "env_sha=$(gf_sha "$env")" && echo "env_mode=$(stat -c %a -- "$env")"
[ -f "$kernel" ] && echo "kernel_sha=$(gf_sha "$kernel")"
command -v systemctl >/dev/null && echo "need_reload=$(systemctl show -p NeedDaemonReload --value -- "$name" 2>/dev/null)"
[ -f "$record" ] && gf_text "$record" && echo "record=${gf_out//$'\n'/}"
if [ -f "$unit" ]; then echo "@@unit present"; gf_text "$unit"; printf '%s' "$gf_out"; else echo "@@unit absent"; fi
