#!/bin/bash
# Print the newest snapshot directory under /var/lib/gpufleet/snapshots (nothing when there is none).
# No arguments.
ls -1d /var/lib/gpufleet/snapshots/*/ 2>/dev/null | sort | tail -n 1 | sed 's:/$::'
