# shellcheck shell=bash
# Shared by epilog-slurmctld.sh and node-down.sh (sourced, not run): configuration, logging and
# the POST. Nothing here may make a hook fail or hang: every error is logged and swallowed.
#
# Configuration: /etc/workload-recovery/hook.env (root-only, mode 0600), or the file named by
# WR_HOOK_ENV; variables already in the environment win over the file. KEY=VALUE lines:
#   WR_HOOK_URL      base URL of the service, e.g. https://recovery.example.org (required)
#   WR_HOOK_TOKEN    the cluster's hook token, wrh_... (required; manage.py issue_ingest_token --kind hook)
#   WR_HOOK_TIMEOUT  seconds for the whole request, default 5
#   WR_HOOK_CA_FILE  CA bundle for a private certificate authority (optional)
#   WR_SLURM_CONF    slurm.conf for sinfo, when not in the default place (optional)

# slurmctld runs hooks with no PATH at all.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HOOK_TAG=workload-recovery-hook
# A Slurm hostlist expression: node names, commas and brackets ("]" first, as a bracket needs).
HOOK_NODELIST_RE='^[][A-Za-z0-9._,-]+$'

hook_log() {
  # syslog when there is one; stderr as well, for a person running the script by hand.
  logger -t "$HOOK_TAG" -- "$*" 2>/dev/null || true
  echo "$HOOK_TAG: $*" >&2
}

hook_load_config() {
  local file=${WR_HOOK_ENV:-/etc/workload-recovery/hook.env} line key value
  if [[ -r $file ]]; then
    if [[ -n $(find "$file" -maxdepth 0 -perm /077 2>/dev/null) ]]; then
      hook_log "warning: $file is readable by others; chmod 600 it (it holds a token)"
    fi
    # Read KEY=VALUE lines, never source: the file must not be able to run anything.
    while IFS= read -r line || [[ -n $line ]]; do
      [[ $line =~ ^[[:space:]]*(WR_[A-Z_]+)=(.*)$ ]] || continue
      key=${BASH_REMATCH[1]}
      value=${BASH_REMATCH[2]}
      value=${value%"${value##*[![:space:]]}"}
      [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]] && value=${BASH_REMATCH[1]}
      case $key in
        WR_HOOK_URL | WR_HOOK_TOKEN | WR_HOOK_TIMEOUT | WR_HOOK_CA_FILE | WR_SLURM_CONF)
          [[ -z ${!key:-} ]] && printf -v "$key" '%s' "$value"
          ;;
      esac
    done <"$file"
  fi
  WR_HOOK_TIMEOUT=${WR_HOOK_TIMEOUT:-5}
  [[ $WR_HOOK_TIMEOUT =~ ^[0-9]+$ ]] || WR_HOOK_TIMEOUT=5
  [[ -n ${WR_SLURM_CONF:-} ]] && export SLURM_CONF=$WR_SLURM_CONF
  if [[ -z ${WR_HOOK_URL:-} || -z ${WR_HOOK_TOKEN:-} ]]; then
    hook_log "not configured: set WR_HOOK_URL and WR_HOOK_TOKEN in $file"
    return 1
  fi
  if [[ $WR_HOOK_TOKEN =~ ^wrc_ ]]; then
    hook_log "WR_HOOK_TOKEN is a controller token (wrc_...), which may not push: issue a hook token with 'manage.py issue_ingest_token --kind hook --cluster NAME'"
    return 1
  fi
  if [[ ! $WR_HOOK_TOKEN =~ ^wrh_[A-Za-z0-9_-]+$ ]]; then
    hook_log "WR_HOOK_TOKEN is not a hook token (wrh_...)"
    return 1
  fi
  if [[ ! $WR_HOOK_URL =~ ^https?://[^[:space:]\"]+$ ]]; then
    hook_log "WR_HOOK_URL is not an http(s) URL"
    return 1
  fi
  return 0
}

hook_post() {  # path under /api/v1/ingest/, JSON body -> logs the answer; 0 when it was 2xx
  local url=${WR_HOOK_URL%/}/api/v1/ingest/$1 body=$2 answer code
  local -a options=(--silent --show-error --proto =http,https --connect-timeout 2
    --max-time "$WR_HOOK_TIMEOUT" -H 'Content-Type: application/json' --data-binary "$body"
    -w '\n%{http_code}')
  [[ -n ${WR_HOOK_CA_FILE:-} ]] && options+=(--cacert "$WR_HOOK_CA_FILE")
  # The token goes in through stdin, so that it never shows in the process list.
  answer=$(printf 'header = "Authorization: Bearer %s"\n' "$WR_HOOK_TOKEN" \
    | curl --config - "${options[@]}" "$url" 2>&1)
  code=${answer##*$'\n'}
  answer=${answer%$'\n'*}
  answer=${answer//$'\n'/ }
  if [[ $code == 2?? ]]; then
    hook_log "POST $1 -> $code ${answer:0:300}"
    return 0
  fi
  hook_log "POST $1 failed (${code:-no answer}): ${answer:0:300}"
  return 1
}

hook_json_string() {  # value -> a JSON string; hook values are checked, this is belt and braces
  local value=${1//\\/\\\\}
  value=${value//\"/\\\"}
  printf '"%s"' "$value"
}
