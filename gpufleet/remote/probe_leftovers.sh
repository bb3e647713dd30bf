#!/bin/bash
# Stop the probe units a killed earlier probe left running; always exits 0.
# Args: $1 the probe units' name prefix (gpufleet-probe-).
for u in $(systemctl list-units --all --plain --no-legend "$1*" 2>/dev/null | awk '{print $1}'); do
    systemctl stop -- "$u" 2>/dev/null; systemctl reset-failed -- "$u" 2>/dev/null; echo "stopped leftover $u"
done; true
