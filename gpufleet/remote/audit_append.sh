#!/bin/bash
# Append one line to the host's audit log, creating its directory.
# Args: $1 the audit log, $2 the line (JSON).
mkdir -p -- "$(dirname -- "$1")" && printf "%s\n" "$2" >> "$1"
