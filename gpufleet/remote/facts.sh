#!/bin/bash
# gpufleet facts library (sent after side_by_side.sh): the gf_* functions the facts script calls, one
# `gf_section NAME COMMAND ARGS...` per section, then `gf_sections_end` (gpufleet/facts/script.py appends those
# calls). Each section is printed as `@@gpufleet-section NAME rc=N@@`, then that command's output; every section
# runs. No arguments of its own: each function takes its values as arguments.
export LC_ALL=C
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
# no optional locks: a facts read must never block or break a git command running on the box
export GIT_OPTIONAL_LOCKS=0 PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# python -m puts the working directory on sys.path: a stray *.dist-info there would show up as installed
cd / || exit 1

# The sections run side by side (side_by_side.sh, sent ahead of this file), and gf_sections_end prints them in the
# order given: a facts read takes as long as its slowest section, not as long as all of them together (on an H200
# box nvidia-smi, the venv's python and git take 0.02-0.03 s each).
gf_names=()

# $1: a section's name; $2: its exit code; $3: its output
gf_print() {
    printf '@@gpufleet-section %s rc=%d@@\n' "$1" "$2"
    if [ -n "$3" ]; then printf '%s\n' "$3"; fi
}

# $1: the section's name; the rest: its command
gf_section() {
    gf_names+=("$1")
    shift
    gf_start "$@"
}

# print the sections started side by side, in the order they were started, each once it has ended
gf_sections_end() {
    local i
    for i in "${!gf_names[@]}"; do
        gf_collect "$i"
        gf_print "${gf_names[i]}" "$gf_rc" "$gf_out"
    done
}

# a wedged driver can hang nvidia-smi for minutes, a dead mount git or python: every section is bounded by one
# deadline (side_by_side.sh), and one that is still running then reads as exit code 124
gf_limit 120

gf_nvidia_smi() {
    local smi
    smi=$(command -v nvidia-smi 2>/dev/null) || smi=
    # A non-interactive SSH session gets sshd's default PATH; container images keep the tool elsewhere.
    if [ -z "$smi" ] && [ -x /usr/local/nvidia/bin/nvidia-smi ]; then smi=/usr/local/nvidia/bin/nvidia-smi; fi
    if [ -z "$smi" ]; then echo "gpufleet: nvidia-smi not found (PATH, /usr/local/nvidia/bin)"; return 127; fi
    "$smi" "$@"
}

# $1: the comma-separated --query-gpu fields
gf_gpu_query() { gf_nvidia_smi --query-gpu="$1" --format=csv,noheader,nounits; }

# The host's cache of gpufleet's answers (as patches_memo.sh and stack_memo.py keep theirs); empty: none
gf_cache=
if [ -n "${GPUFLEET_HOST_CACHE:-}" ]; then gf_cache=$GPUFLEET_HOST_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then gf_cache=$XDG_CACHE_HOME/gpufleet
elif [ -n "${HOME:-}" ]; then gf_cache=$HOME/.cache/gpufleet
fi

# The driver's CUDA version: `--version` answers it without drawing the whole GPU and process table (plain
# nvidia-smi: 0.10 s of CPU on an H200 box, `--version`: 0.01 s); no query form carries it. It changes only with
# the driver, so its answer is remembered under the loaded kernel module's own version text ($1:
# /proc/driver/nvidia/version; a user-space driver that does not match the module answers nothing at all) and the
# nvidia-smi that gave it: a status asks nvidia-smi once, not twice. Without that file, or a cache, it asks each time.
gf_gpu_header() {
    local module= key have= out rc smi memo=
    { IFS= read -r -d '' module <"$1"; } 2>/dev/null
    smi=$(command -v nvidia-smi 2>/dev/null) || smi=
    key="nvidia-smi=$smi"$'\n'"$module"
    if [ -n "$module" ] && [ -n "$gf_cache" ]; then
        memo=$gf_cache/driver-cuda
        { IFS= read -r -d '' have <"$memo"; } 2>/dev/null
        if [ "${have%%$'\n'@@answer@@$'\n'*}" = "$key" ]; then
            printf '%s' "${have#*$'\n'@@answer@@$'\n'}"
            return 0
        fi
    fi
    out=$(gf_nvidia_smi --version 2>&1)
    rc=$?
    printf '%s\n' "$out"
    if [ "$rc" = 0 ] && [ -n "$memo" ]; then
        # best effort: a cache that cannot be written only means asking again next time
        { mkdir -p -m 700 "$gf_cache" && printf '%s\n@@answer@@\n%s\n' "$key" "$out" >"$memo.$$" \
            && mv -f "$memo.$$" "$memo"; } 2>/dev/null || rm -f "$memo.$$" 2>/dev/null
    fi
    return "$rc"
}

# Small files are read with bash's own `read`, not cat or grep: each process a section starts costs the host about
# a millisecond of CPU, on every status of every box.
# $1: a file; prints its lines (a last line without a newline gets one, as cat and grep print it)
gf_lines() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done <"$1"
}

gf_os() {
    local kernel arch
    read -r kernel arch <<<"$(uname -r -m)"
    echo "KERNEL=$kernel"
    echo "ARCH=$arch"
    if [ -r /etc/os-release ]; then gf_lines /etc/os-release
    elif [ -r /usr/lib/os-release ]; then gf_lines /usr/lib/os-release
    else echo "gpufleet: no /etc/os-release"; return 1
    fi
}

gf_mem() {
    local line
    while IFS= read -r line; do
        case "$line" in MemTotal:*|MemAvailable:*) printf '%s\n' "$line" ;; esac
    done </proc/meminfo
}

# Each path's free space, as `path=`, `checked=` (the nearest directory that exists) and `df -PB1` of it. One df for
# all of them (a process each was ~1.3 ms of the host's CPU), its header and rows dealt out in order; should df fail
# or answer with other than one row a path, each path gets a df of its own, errors and all.
gf_disk() {
    local asked at rc=0 out line header= i=0
    local -a ats=() rows=()
    for asked in "$@"; do
        at=$asked
        # up to the nearest directory that exists (dirname's answer, without a process a level)
        while [ ! -e "$at" ] && [ "$at" != / ] && [ "$at" != . ]; do
            case "$at" in */*) at=${at%/*}; at=${at:-/} ;; *) at=. ;; esac
        done
        ats+=("$at")
    done
    if [ $# -eq 0 ]; then return 0; fi
    if out=$(df -PB1 -- "${ats[@]}" 2>/dev/null); then
        while IFS= read -r line; do
            if [ -z "$header" ]; then header=$line; else rows+=("$line"); fi
        done <<<"$out"
    fi
    if [ ${#rows[@]} -eq $# ]; then
        for asked in "$@"; do
            printf 'path=%s\nchecked=%s\n%s\n%s\n' "$asked" "${ats[i]}" "$header" "${rows[i]}"
            i=$((i + 1))
        done
        return 0
    fi
    for asked in "$@"; do
        echo "path=$asked"
        echo "checked=${ats[i]}"
        df -PB1 -- "${ats[i]}" || rc=$?
        i=$((i + 1))
    done
    return $rc
}

gf_nvcc() {
    local nvcc
    nvcc=$(command -v nvcc 2>/dev/null) || nvcc=
    if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
    if [ -z "$nvcc" ]; then echo "gpufleet: nvcc not found (PATH, /usr/local/cuda/bin)"; return 127; fi
    "$nvcc" --version
}

gf_venv_python() {
    if [ ! -x "$1/bin/python" ]; then echo "gpufleet: venv missing: $1"; return 127; fi
}

# The venv's Python version and its installed distributions from one python process (facts_dists.py reads the
# metadata directories as pip would, ~0.02 s against pip list's ~0.35 s; -S: it runs site itself, without the
# import lines of setuptools' .pth files). Prints the python section's text, then the packages section's header and
# text itself. $1: the venv; $2: facts_dists.py's source.
gf_venv() {
    local out rc
    if ! gf_venv_python "$1"; then
        printf '@@gpufleet-section packages rc=127@@\ngpufleet: venv missing: %s\n' "$1"
        return 127
    fi
    out=$("$1/bin/python" -S -c "$2" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    # a reader that died before its packages header: the packages section still comes, with its exit code
    case "$out" in
        *"@@gpufleet-section packages rc="*) ;;
        *) printf '@@gpufleet-section packages rc=%d@@\n%s\n' "$rc" "$out" ;;
    esac
    return $rc
}

gf_git() {
    local dir=$1
    shift
    git -c safe.directory='*' -c core.quotepath=false -C "$dir" "$@"
}

# Where the checkout keeps sgl-kernel: the first candidate whose pyproject names sgl-kernel (upstream until mid-2026)
# or sglang-kernel (python/sglang/kernels/aot since then), with the version it declares (what a build installs).
# $1: the checkout; $2...: the candidate directories in it.
gf_kernel_dir() {
    local co=$1 d name version line
    local name_re='^name *= *"([^"]*)"' version_re='^version *= *"([^"]*)"'
    shift
    for d in "$@"; do
        [ -r "$co/$d/pyproject.toml" ] || continue
        # the first `name = "..."` and the first `version = "..."` line, read by bash (was sed | head: four processes)
        name= version=
        while IFS= read -r line || [ -n "$line" ]; do
            if [ -z "$name" ] && [[ $line =~ $name_re ]]; then name=${BASH_REMATCH[1]}; fi
            if [ -z "$version" ] && [[ $line =~ $version_re ]]; then version=${BASH_REMATCH[1]}; fi
        done <"$co/$d/pyproject.toml"
        case "$name" in
            sgl-kernel|sgl_kernel|sglang-kernel|sglang_kernel)
                echo "kernel_dir=$d"
                echo "kernel_name=$name"
                echo "kernel_version=$version"
                return 0 ;;
        esac
    done
}

# The branch line of `git status --porcelain=v1 --branch` (without its `## `), as the lines the checkout section
# has always printed: branch= (empty when detached), upstream= (empty when unset or gone), ahead_behind=A<tab>B
# (empty without both a HEAD and a live upstream), as `symbolic-ref`, `rev-parse @{u}` and `rev-list --count` said.
# $1: the line; $2: HEAD (empty before the first commit).
gf_branch_line() {
    local rest=$1 head=$2 branch= upstream= mark= ahead=0 behind=0 part
    case "$rest" in
        "HEAD (no branch)"*) rest= ;;
        "No commits yet on "*) rest=${rest#No commits yet on } ;;
        "Initial commit on "*) rest=${rest#Initial commit on } ;;
    esac
    case "$rest" in *" ["*"]") mark=${rest##* \[}; mark=${mark%]}; rest=${rest% \[*} ;; esac
    branch=${rest%%...*}  # a ref name never holds "..": the first one parts branch and upstream
    case "$rest" in *...*) upstream=${rest#*...} ;; esac
    echo "branch=$branch"
    if [ "$mark" = gone ]; then upstream=; fi
    echo "upstream=$upstream"
    if [ -z "$upstream" ] || [ -z "$head" ]; then echo "ahead_behind="; return 0; fi
    local IFS=,
    for part in $mark; do
        part=${part# }
        case "$part" in "ahead "*) ahead=${part#ahead } ;; "behind "*) behind=${part#behind } ;; esac
    done
    printf 'ahead_behind=%s\t%s\n' "$ahead" "$behind"
}

# $1: the checkout; $2: its `git status --porcelain=v2 --branch --ahead-behind`. Prints head=, branch=, upstream=
# and ahead_behind= as gf_branch_line does from porcelain v1, and puts the file lines, in v1's form (`XY path`,
# `XY old -> new`, `?? path`), into gf_files.
gf_status_v2() {
    local line rest code n oid= branch= upstream= ab=
    gf_files=
    while IFS= read -r line; do
        case "$line" in
            "# branch.oid "*) oid=${line#"# branch.oid "} ;;
            "# branch.head "*) branch=${line#"# branch.head "} ;;
            "# branch.upstream "*) upstream=${line#"# branch.upstream "} ;;
            "# branch.ab "*) ab=${line#"# branch.ab "} ;;
            [12u]" "*)
                # changed, renamed or copied, unmerged: 7, 8 or 9 fields (XY first) before the path
                rest=${line:2}
                code=${rest%% *}
                case "$line" in 1*) n=7 ;; 2*) n=8 ;; *) n=9 ;; esac
                while [ "$n" -gt 0 ]; do rest=${rest#* }; n=$((n - 1)); done
                case "$line" in 2*) rest="${rest#*$'\t'} -> ${rest%%$'\t'*}" ;; esac  # new<TAB>old: old -> new
                gf_files+="${code//./ } $rest"$'\n' ;;
            "? "*) gf_files+="?? ${line:2}"$'\n' ;;
            "! "*) gf_files+="!! ${line:2}"$'\n' ;;
        esac
    done <<<"$2"
    if [ "$oid" = "(initial)" ]; then oid=; fi
    if [ "$branch" = "(detached)" ]; then branch=; fi
    # an upstream without a distance is gone (v1's [gone]), unless there is no commit yet to count from: then ask
    if [ -n "$upstream" ] && [ -z "$ab" ]; then
        if [ -n "$oid" ] || ! gf_git "$1" rev-parse -q --verify '@{upstream}' >/dev/null 2>&1; then upstream=; fi
    fi
    echo "head=$oid"
    echo "branch=$branch"
    echo "upstream=$upstream"
    if [ -z "$upstream" ] || [ -z "$oid" ] || [ -z "$ab" ]; then echo "ahead_behind="; return 0; fi
    rest=${ab#+}
    printf 'ahead_behind=%s\t%s\n' "${rest%% *}" "${rest#* -}"
}

# $1: the checkout; $2...: where sgl-kernel may live in it (gf_kernel_dir). A checkout's top holds .git (a
# directory, or a file in a worktree): there two or three git commands answer, one status (porcelain v2: HEAD,
# branch, upstream, distance, files), the origin, and the stashes only where there may be any. Anything else (no
# .git: a plain directory or a subdirectory; a status that fails: a bare or broken repository) is told apart as
# before: rev-parse for the top and HEAD, then porcelain v1.
gf_checkout() {
    local dir=$1 top real out head= status rc line files=
    shift
    echo "path=$dir"
    if [ ! -e "$dir" ]; then echo "exists=no"; echo "present=no"; return 0; fi
    echo "exists=yes"
    if ! command -v git >/dev/null 2>&1; then echo "gpufleet: git not found"; return 127; fi
    # --ahead-behind: a status.aheadBehind=false in the host's git config would leave out the counts
    if [ -e "$dir/.git" ] && [ -z "${GIT_DIR:-}${GIT_WORK_TREE:-}" ] \
        && status=$(gf_git "$dir" status --porcelain=v2 --branch --ahead-behind 2>/dev/null); then
        rc=0
        echo "present=yes"
        gf_status_v2 "$dir" "$status"
        files=$gf_files
    else
        out=$(gf_git "$dir" rev-parse --show-toplevel --verify -q HEAD 2>/dev/null)
        top=${out%%$'\n'*}
        case "$out" in *$'\n'*) head=${out#*$'\n'} ;; esac
        real=$(cd -- "$dir" 2>/dev/null && pwd -P) || real=$dir
        if [ -z "$top" ] || [ "$top" != "$real" ]; then echo "present=no"; echo "toplevel=$top"; return 0; fi
        echo "present=yes"
        echo "head=$head"
        status=$(gf_git "$dir" status --porcelain=v1 --branch --ahead-behind 2>&1)
        rc=$?
        if [ "$rc" = 0 ]; then
            while IFS= read -r line; do
                case "$line" in
                    "## "*) gf_branch_line "${line#\#\# }" "$head" ;;
                    *) files+=$line$'\n' ;;
                esac
            done <<<"$status"
        fi
    fi
    echo "remote_url=$(gf_git "$dir" remote get-url origin 2>/dev/null)"
    gf_kernel_dir "$dir" "$@"
    echo "@@status"
    if [ "$rc" != 0 ]; then printf '%s\n' "$status"; return "$rc"; fi
    printf '%s' "$files"
    echo "@@stash"
    # `git stash list` lists the stash's reflog: in a plain .git directory without one it would print nothing (a
    # converged host's usual state, `stash pop` removes it), and one git process fewer is ~3 ms of the host's CPU
    if [ -z "${GIT_DIR:-}" ] && [ -d "$dir/.git" ] && [ ! -e "$dir/.git/reftable" ] \
        && [ ! -e "$dir/.git/logs/refs/stash" ]; then
        return 0
    fi
    gf_git "$dir" stash list
}

# One `systemctl show` for the unit file, is-enabled's and is-active's words (UnitFileState, ActiveState): each
# systemctl costs a few ms of CPU, and three of them were a tenth of the script's.
gf_unit() {
    local name=$1 path= enabled= active= line sum
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        echo "systemd=present"
        while IFS= read -r line; do
            case "$line" in
                FragmentPath=*) path=${line#*=} ;;
                UnitFileState=*) enabled=${line#*=} ;;
                ActiveState=*) active=${line#*=} ;;
            esac
        done < <(systemctl show -p FragmentPath -p UnitFileState -p ActiveState -- "$name" 2>/dev/null)
        echo "enabled=$enabled"
        echo "active=$active"
    else
        echo "systemd=absent"
    fi
    if [ -z "$path" ] && [ -f "/etc/systemd/system/$name" ]; then path=/etc/systemd/system/$name; fi
    echo "path=$path"
    if [ -n "$path" ] && [ -f "$path" ]; then sum=$(sha256sum <"$path") && echo "sha256=${sum%% *}"; fi
}
