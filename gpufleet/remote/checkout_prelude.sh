#!/bin/bash
# Shared start of the sglang checkout scripts: g() runs git in $co, never prompting.
# Expects $co set by the caller.
set -u
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
# never wait for a password or a host-key prompt
export GIT_TERMINAL_PROMPT=0 GIT_SSH_COMMAND="${GIT_SSH_COMMAND:-ssh -o BatchMode=yes}"
