#!/bin/bash
# kernel_tree CHECKOUT TREE TREE_SHA RC_FILE UNIT PID_FILE DIR [OUTSIDE...] -- [PATCH_NAME PATCH_TEXT]...: export the
# checkout's HEAD (DIR, the OUTSIDE repo paths its CMakeLists names, and the in-repo targets of symlinks in them) into
# TREE and apply the patches there (relative to DIR), so the build never writes to the checkout, nor to its .git.
# HEAD:DIR must still be TREE_SHA (the build key's tree). While the build job (RC_FILE, UNIT, PID_FILE) runs or has
# finished with 0, TREE is the job's own and is left alone; otherwise a half-made or old TREE is discarded and
# made again. TREE appears only complete: it is made beside itself and renamed into place.
# A library after job_state.sh: the caller appends the call (roles/sgl_kernel.py).
kernel_tree() {
    local co=$1 tree=$2 want=$3 rc=$4 unit=$5 pid=$6 dir=$7
    shift 7
    local outside=() p
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do outside+=("$1"); shift; done
    shift
    local st
    st=$(job_state "$rc" "$unit" "$pid")
    case "$st" in
        running|"finished 0") echo "build tree left as it is: the build job is ${st% 0}"; return 0;;
    esac
    # A read of the checkout (which may belong to another user): no optional lock or index refresh writes its .git.
    export GIT_OPTIONAL_LOCKS=0
    g() { git -c safe.directory='*' -C "$co" "$@"; }
    local head sha
    head=$(g rev-parse --verify -q 'HEAD^{commit}') || { echo "gpufleet: $co has no HEAD commit"; return 1; }
    sha=$(g rev-parse --verify -q "HEAD:$dir") || { echo "gpufleet: no $dir at HEAD ($head) of $co"; return 1; }
    if [ "$sha" != "$want" ]; then
        echo "gpufleet: $co moved since the plan: HEAD:$dir is $sha, the build key names $want (plan again)"
        return 1
    fi
    local part="$tree.partial.$$"
    rm -rf -- "$tree" "$tree".partial.* || return
    mkdir -p -- "$part" || return
    export GIT_CEILING_DIRECTORIES=${tree%/*}  # git apply below never finds a repository above the tree
    local paths=("$dir")
    for p in "${outside[@]}"; do
        if g cat-file -e "HEAD:$p" 2>/dev/null; then paths+=("$p"); else echo "not at HEAD, not exported: $p"; fi
    done
    _kernel_tree_export "$part" "$head" "${paths[@]}" || { rm -rf -- "$part"; return 1; }
    # A symlink whose target is elsewhere in the repository (a LICENSE -> ../LICENSE) gets that target too.
    local round link target
    for round in 1 2 3; do
        local more=()
        while IFS= read -r -d '' link; do
            target=$(realpath -m --relative-to="$part" -- "$(dirname -- "$link")/$(readlink -- "$link")")
            case "$target" in ..|../*|/*) continue;; esac
            [ -e "$part/$target" ] || [ -L "$part/$target" ] || more+=("$target")
        done < <(find "$part" -type l -print0)
        [ "${#more[@]}" -gt 0 ] || break
        for p in "${more[@]}"; do
            if g cat-file -e "HEAD:$p" 2>/dev/null; then
                _kernel_tree_export "$part" "$head" "$p" || { rm -rf -- "$part"; return 1; }
            else
                echo "symlink target not at HEAD, left dangling: $p"
            fi
        done
    done
    local name text out n=0
    while [ "$#" -ge 2 ]; do
        name=$1 text=$2
        shift 2
        if ! out=$(cd -- "$part" && printf '%s' "$text" | git apply --directory="$dir" - 2>&1); then
            echo "gpufleet: patch $name does not apply to $dir at HEAD ($head): $out"
            rm -rf -- "$part"
            return 1
        fi
        echo "applied: $name"
        n=$((n + 1))
    done
    mv -T -- "$part" "$tree" || { rm -rf -- "$part"; return 1; }
    echo "build tree: $dir at ${head:0:12} from $co, $n patch(es) applied, in $tree"
}

# _kernel_tree_export DEST COMMIT PATH...: the paths of COMMIT (as git stores them, symlinks as symlinks) under DEST.
_kernel_tree_export() {
    local dest=$1 commit=$2
    shift 2
    set -o pipefail
    g archive --format=tar "$commit" -- "$@" | tar -x --no-same-owner -C "$dest" -f -
    local rc=$?
    set +o pipefail
    [ "$rc" = 0 ] || echo "gpufleet: exporting $* of $commit from $co failed"
    return "$rc"
}
