#!/bin/bash
# Unpack the pushed files as `<path>.part`, hash each on the host, rename into place only with the right sha256.
# Stdin: a tar stream of absolute-path-less `<path>.part` members. Args as push_check.sh: sha path sha path ...
# One line per item: "@@push I ok|bad GOT|missing"; a failed tar removes every part and says "@@push tar-failed RC".
# digest() comes from sha256_digest.sh, sent ahead.
tar -x -f - -C / --no-same-owner --no-same-permissions
rc=$?
if [ $rc -ne 0 ]; then
  while [ $# -ge 2 ]; do rm -f -- "$2.part"; shift 2; done
  echo "@@push tar-failed $rc"
  exit 2
fi
i=0; bad=0
while [ $# -ge 2 ]; do
  want=$1; path=$2; part="$2.part"; shift 2
  if [ ! -f "$part" ]; then
    echo "@@push $i missing"; bad=1
  else
    got=$(digest "$part")
    if [ "$got" = "$want" ] && mv -f -- "$part" "$path"; then echo "@@push $i ok"
    else rm -f -- "$part"; echo "@@push $i bad $got"; bad=1
    fi
  fi
  i=$((i+1))
done
exit $bad
