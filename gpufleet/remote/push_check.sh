#!/bin/bash
# Which pushed files the host has already, with the right sha256 (digest() comes from sha256_digest.sh, sent ahead).
# Args: sha path sha path ... ; one line per item: "@@push I present|absent|differs [GOT]".
i=0
while [ $# -ge 2 ]; do
  want=$1; path=$2; shift 2
  if [ -f "$path" ]; then
    got=$(digest "$path")
    if [ "$got" = "$want" ]; then echo "@@push $i present"; else echo "@@push $i differs $got"; fi
  else
    echo "@@push $i absent"
  fi
  i=$((i+1))
done
