# shellcheck shell=bash
# Process helpers shared by the development scripts (sourced, not run).

say() { echo "${0##*/}: $*" >&2; }

pid_in() {  # pid file -> the pid it holds, or nothing
  local pid=""
  [[ -r $1 ]] && read -r pid <"$1" 2>/dev/null
  [[ $pid =~ ^[0-9]+$ ]] && echo "$pid"
  return 0
}

alive() {  # pid -> running (a zombie counts as gone)
  local stat=""
  [[ -n ${1:-} ]] && read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != [ZX] ]]
}
