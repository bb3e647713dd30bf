#!/bin/bash
# Wait until nothing accepts connections on an address and port (the next server must bind it).
# Args: $1 address, $2 port, $3 seconds to wait.
addr=$1 port=$2 wait=$3 i=0
while (exec 3<>"/dev/tcp/$addr/$port") 2>/dev/null; do
    i=$((i + 1)); [ "$i" -lt "$wait" ] || { echo "something still listens on $addr:$port after ${wait}s"; exit 1; }
    sleep 1
done
echo "$addr:$port is free"
