# Source this (". examples/claude-code/env.sh") before `claude`: it points Claude Code at the gateway
# and sizes Claude Code's compaction and answers to the gateway's context window, read from
# /v1/models (max_model_len), so Claude Code compacts before a prompt overflows.
export ANTHROPIC_BASE_URL="${ANTHROPIC_BASE_URL:-http://127.0.0.1:8090}"
export ANTHROPIC_AUTH_TOKEN="${PFLASH_GATEWAY_KEY:-unused}"
export ANTHROPIC_MODEL=pflash-local
export ANTHROPIC_DEFAULT_SONNET_MODEL=pflash-local
export ANTHROPIC_DEFAULT_OPUS_MODEL=pflash-local
export ANTHROPIC_DEFAULT_HAIKU_MODEL=pflash-local
export ANTHROPIC_SMALL_FAST_MODEL=pflash-local
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1

pflash_ctx=$(curl -fsS -H "Authorization: Bearer $ANTHROPIC_AUTH_TOKEN" "$ANTHROPIC_BASE_URL/v1/models" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])') || pflash_ctx=
if [ -n "$pflash_ctx" ]; then
    # Compaction is computed against this window instead of the 200k Claude Code assumes.
    export CLAUDE_CODE_AUTO_COMPACT_WINDOW="$pflash_ctx"
    # One answer may take at most an eighth of the window (at least 1024, at most 32000 tokens).
    out=$((pflash_ctx / 8)); [ "$out" -lt 1024 ] && out=1024; [ "$out" -gt 32000 ] && out=32000
    export CLAUDE_CODE_MAX_OUTPUT_TOKENS="$out"
    echo "pflash-gateway: context $pflash_ctx tokens; compaction window $pflash_ctx, max output $out" >&2
else
    echo "pflash-gateway not reachable at $ANTHROPIC_BASE_URL: compaction settings left unset" >&2
fi
unset pflash_ctx out
