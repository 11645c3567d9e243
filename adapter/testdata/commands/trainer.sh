#!/bin/sh
# A test trainer for the command backend (docs/training-protocol.md, the
# command protocol): invoked as trainer.sh SPEC JOB_ID ADAPTER_NAME
# OUTPUT_URI, it prints training_event/v1 JSON lines on stdout and trains
# nothing. What it does depends on the capability's name in the spec file
# (read from the file, so the test proves the spec was written):
#   …succeed…    started, 2 progress, succeeded, exit 0
#   …fail…       started, 1 progress, an error on stderr, exit 3
#   …hang…       started, then a child sleeps (the timeout must kill the group;
#                the child's pid goes to SPEC.pid)
#   …malformed…  started, a log line, 3 malformed event lines, progress, succeeded
#   …quiet…      started, exit 0 without a terminal event
set -eu
spec=$1 job=$2 name=$3 uri=$4
test -f "$spec" || { echo "no spec file $spec" >&2; exit 64; }
cap=$(sed -n 's/.*"capability":{"name":"\([a-z0-9_]*\)".*/\1/p' "$spec")
test "$TRACE_JOB_ID" = "$job" || { echo "TRACE_JOB_ID=$TRACE_JOB_ID is not $job" >&2; exit 65; }
now() { date -u +%Y-%m-%dT%H:%M:%S.%NZ; }
ev() { printf '{"schema":"training_event/v1","job_id":"%s","at":"%s","worker":"testdata-command",%s}\n' "$job" "$(now)" "$1"; }
ev '"type":"started","iterations":2'
# GATE (optional): wait, at most 10 s, until that file exists.
if [ -n "${GATE:-}" ]; then
	i=0
	while [ ! -e "$GATE" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
fi
case $cap in
*succeed*)
	ev '"type":"progress","iteration":1,"mean_reward":0.4,"reward_std":0.2'
	ev '"type":"progress","iteration":2,"mean_reward":0.55,"reward_std":0.15,"kl":0.002'
	ev "\"type\":\"succeeded\",\"adapter\":{\"name\":\"$name\",\"uri\":\"$uri\"},\"eval\":{\"mean_reward\":0.7,\"success_rate\":0.5,\"episodes\":100}"
	;;
*fail*)
	ev '"type":"progress","iteration":1,"mean_reward":0.3,"reward_std":0.2'
	echo "loading the base model" >&2
	echo "RuntimeError: CUDA out of memory (test trainer)" >&2
	exit 3
	;;
*hang*)
	sleep 300 &
	echo $! > "$spec.pid"
	wait
	;;
*malformed*)
	echo "step 1: loss=0.31 (a log line, not an event)"
	printf '{"schema":"training_event/v1","job_id":"%s","type":"progress"\n' "$job"
	ev '"type":"finished"'
	ev '"type":"progress","iteration":1'
	ev '"type":"progress","iteration":1,"mean_reward":0.5,"reward_std":0.1'
	ev "\"type\":\"succeeded\",\"adapter\":{\"name\":\"$name\",\"uri\":\"$uri\"},\"eval\":{\"mean_reward\":0.6,\"success_rate\":0.4,\"episodes\":100}"
	;;
*quiet*)
	;;
esac
