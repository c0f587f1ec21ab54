#!/usr/bin/env bash
# GPU check of the sglang engine (one GPU, ~8 minutes): a tiny random-weight Llama served
# by one prefill and one decode SGLang server on the SAME GPU, both started through
# `pdwarden runtime serve --engine sglang` (NIXL transfer backend, hardening active in
# every SGLang process), SGLang's real router (smg) in PD mode in front, 500 requests with
# 30% cancelled mid-flight, then one JSON line: completed, aborted, wedged rooms,
# p50/p99 latency, KV transfer GB/s (+ the doctor's verdict and the outcome counters).
#
#   bench/gpu_pd_check.sh            run it (needs an NVIDIA GPU, sglang, nixl, smg)
#   bench/gpu_pd_check.sh --dry-run  no GPU: make the model, check it, print and check the
#                                    launcher's SGLang arguments, print the commands
#
# Environment: PDWARDEN_PYTHON (interpreter with pdwarden installed; default: the repo's
# .venv, else python3), GPU_CHECK_BUDGET_S (default 470), GPU_CHECK_REQUESTS (500),
# GPU_CHECK_CANCEL (0.3), GPU_CHECK_KEEP=1 keeps the work directory.
# Nothing is downloaded: the model config and tokenizer are made on the spot.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1

if [[ -n "${PDWARDEN_PYTHON:-}" ]]; then PY="$PDWARDEN_PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
if [[ -x "$(dirname "$PY")/pdwarden" ]]; then PDW=("$(dirname "$PY")/pdwarden")
else PDW=("$PY" -c 'import sys; from pdwarden_cli.main import main; sys.argv[0] = "pdwarden"; main()'); fi
HELPER=("$PY" "$HERE/gpu_pd_check.py")

BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"
REQUESTS="${GPU_CHECK_REQUESTS:-500}"
CANCEL="${GPU_CHECK_CANCEL:-0.3}"
START=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - START) )); }
# seconds of budget left minus a reserve for what follows, at least 30
budget_minus() { local t=$(( $(left) - $1 )); echo $(( t > 30 ? t : 30 )); }
say() { echo "[gpu_pd_check +$((SECONDS - START))s] $*" >&2; }

HOST=127.0.0.1
P_HTTP=32300 P_BOOT=32301 P_METRICS=32302
D_HTTP=32310 D_METRICS=32312
ROUTER=32320 ROUTER_METRICS=32321

WORK="$(mktemp -d /tmp/pdwarden-gpu-check.XXXXXX)"
MODEL="$WORK/model"
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for _ in $(seq 1 40); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 1
  done
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if [[ "${GPU_CHECK_KEEP:-0}" == 1 ]]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

show_logs() {
  local f
  for f in "$WORK"/*.log; do
    [[ -f "$f" ]] || continue
    echo "----- tail of $f" >&2
    tail -n 40 "$f" >&2
  done
}
trap 'say "FAILED (line $LINENO)"; show_logs' ERR

# SGLang arguments shared by both roles. The launcher adds --disaggregation-mode,
# --disaggregation-transfer-backend nixl, --disaggregation-bootstrap-port, --host, --port
# and --enable-metrics. Both servers share one GPU: each takes 30% of the memory that is
# free when it starts (so they start one after the other), no CUDA graphs (start-up time).
SGLANG_ARGS=(
  --model-path "$MODEL" --load-format dummy --served-model-name tiny-random
  --mem-fraction-static 0.3 --context-length 4096 --max-running-requests 128
  --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled --log-level warning
)

serve_cmd() {  # role http_port metrics_port -> SERVE (an array: no word splitting)
  SERVE=("${PDW[@]}" runtime serve --role "$1" --engine sglang --host "$HOST" --port "$2"
    --bootstrap-port "$P_BOOT" --metrics-port "$3" --inflight-deadline 300 --transfer-deadline 30
    -- "${SGLANG_ARGS[@]}")
}

start() {  # name command...
  local name="$1"; shift
  setsid "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  say "started $name (pid $!): $(printf '%q ' "$@")"
}

say "python: $PY; work directory: $WORK"
"${HELPER[@]}" make-model "$MODEL"
"${HELPER[@]}" check-model "$MODEL"

# SGLang's router (smg) as the operator renders it: its module and retry/breaker settings.
read -r -a ROUTER_CMD <<<"$("$PY" -c 'from pdwarden_operator.render.router import ROUTER_MODULE as m, ROUTER_RESILIENCE_ARGS as a; print("-m", m, *a)')"

if (( DRY_RUN )); then
  "${HELPER[@]}" plan --host "$HOST" --port "$P_HTTP" --bootstrap-port "$P_BOOT" prefill -- "${SGLANG_ARGS[@]}"
  "${HELPER[@]}" plan --host "$HOST" --port "$D_HTTP" --bootstrap-port "$P_BOOT" decode -- "${SGLANG_ARGS[@]}"
  echo "would run:"
  serve_cmd prefill "$P_HTTP" "$P_METRICS"; echo "  $(printf '%q ' "${SERVE[@]}")"
  serve_cmd decode "$D_HTTP" "$D_METRICS"; echo "  $(printf '%q ' "${SERVE[@]}")"
  echo "  $PY ${ROUTER_CMD[*]} --pd-disaggregation --prefill http://$HOST:$P_HTTP $P_BOOT" \
       "--decode http://$HOST:$D_HTTP --host $HOST --port $ROUTER --prometheus-port $ROUTER_METRICS"
  echo "dry run ok"
  exit 0
fi

command -v nvidia-smi >/dev/null || { say "no nvidia-smi: this check needs an NVIDIA GPU"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader >&2

say "doctor (fresh processes, SGLang's spawn start method)"
DOCTOR_JSON="$("${PDW[@]}" runtime doctor --engine sglang --json || true)"
echo "$DOCTOR_JSON" >"$WORK/doctor.json"
DOCTOR_OK="$("$PY" -c 'import json,sys; print(str(json.load(open(sys.argv[1])).get("ok", False)).lower())' "$WORK/doctor.json" 2>/dev/null || echo false)"
say "doctor ok: $DOCTOR_OK"

# Prefill first, then decode: each sizes its KV pool from the GPU memory free at its start.
serve_cmd prefill "$P_HTTP" "$P_METRICS"
start prefill "${SERVE[@]}"
"${HELPER[@]}" wait "http://$HOST:$P_HTTP/health" "http://$HOST:$P_METRICS/metrics" --timeout "$(budget_minus 200)"
serve_cmd decode "$D_HTTP" "$D_METRICS"
start decode "${SERVE[@]}"
"${HELPER[@]}" wait "http://$HOST:$D_HTTP/health" "http://$HOST:$D_METRICS/metrics" --timeout "$(budget_minus 110)"

start router "$PY" "${ROUTER_CMD[@]}" --pd-disaggregation \
  --prefill "http://$HOST:$P_HTTP" "$P_BOOT" --decode "http://$HOST:$D_HTTP" \
  --host "$HOST" --port "$ROUTER" --prometheus-port "$ROUTER_METRICS" --policy round_robin \
  --log-level warn
"${HELPER[@]}" wait-generate "http://$HOST:$ROUTER" --timeout 60

say "load: $REQUESTS requests, ${CANCEL} cancelled; $(left) s of budget left"
"${HELPER[@]}" load --router "http://$HOST:$ROUTER" \
  --prefill-metrics "http://$HOST:$P_METRICS/metrics" --decode-metrics "http://$HOST:$D_METRICS/metrics" \
  --prefill-sglang-metrics "http://$HOST:$P_HTTP/metrics" --decode-sglang-metrics "http://$HOST:$D_HTTP/metrics" \
  --requests "$REQUESTS" --cancel-fraction "$CANCEL" --request-timeout 60 \
  --drain-s "$(( $(left) > 100 ? 45 : 15 ))" \
  --extra "{\"doctor_ok\": $DOCTOR_OK, \"gpu_check_seconds_before_load\": $((SECONDS - START))}"
say "done in $((SECONDS - START)) s"
