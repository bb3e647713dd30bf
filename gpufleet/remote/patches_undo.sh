#!/bin/bash
# gf_undo: reverse, newest first, the patches this run applied (done_+=("DIRARGS|FILE") after each).
# Sourced after patches_base.sh by apply_command; no arguments.
done_=()
gf_undo() {
    local i
    for ((i=${#done_[@]}-1; i>=0; i--)); do
        (cd "$co" && git -c safe.directory='*' apply ${done_[i]%%|*} --reverse "${done_[i]#*|}") \
            || echo "gpufleet: could not undo ${done_[i]#*|}"
    done
}
