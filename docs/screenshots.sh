#!/usr/bin/env bash
# Retakes the screenshots of docs/dashboards.md from a real run, end to end:
#   1. trains the built-in demo (configs/demo-cpu.yaml) into a scratch directory, with a Prefect
#      home of its own there (the temporary server's database);
#   2. serves MLflow's UI on that run's store and Prefect's UI on that Prefect home, on loopback;
#   3. photographs nine pages with headless Chromium, driven over the DevTools protocol (the
#      pages are single-page apps; a few need a click, a search or a zoom first);
#   4. stops both servers and removes the scratch directory.
#
# Usage, from anywhere (needs .venv with ppoflow, MLflow and Prefect, and Chromium):
#   docs/screenshots.sh
# Settings (environment): SHOTS_DIR (scratch, default /tmp/ppoflow-shots; deleted first and at
# the end unless KEEP_SHOTS_DIR=1), SHOTS_OUT (default docs/img), STEPS (250) and TEST_FREQ (25),
# MLFLOW_PORT (5055), PREFECT_PORT (4210), CDP_PORT (9333), CHROMIUM (chromium).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
DIR=${SHOTS_DIR:-/tmp/ppoflow-shots}
OUT=${SHOTS_OUT:-docs/img}
STEPS=${STEPS:-250}
TEST_FREQ=${TEST_FREQ:-25}
MLFLOW_PORT=${MLFLOW_PORT:-5055}
PREFECT_PORT=${PREFECT_PORT:-4210}
export CDP_PORT=${CDP_PORT:-9333}
export CHROMIUM=${CHROMIUM:-chromium}
PY=$REPO/.venv/bin/python
BIN=$REPO/.venv/bin

export OMP_NUM_THREADS=1
export PREFECT_HOME=$DIR/prefect-home              # the run's temporary server writes here
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false     # no job-runner processes (GenAI scorers)

case "$DIR" in /|"$REPO"|"$REPO"/*|"$HOME") echo "refusing SHOTS_DIR=$DIR" >&2; exit 2 ;; esac
rm -rf "$DIR"
mkdir -p "$DIR" "$OUT"

pids=()
stop_servers() {
    local pid
    for pid in "${pids[@]}"; do  # each server leads a process group of its own (setsid)
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for _ in $(seq 1 20); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_servers
    if [ "${KEEP_SHOTS_DIR:-0}" != 1 ]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {  # URL, seconds
    for _ in $(seq 1 "$2"); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 1
    done
    echo "no answer from $1 after $2 s" >&2
    return 1
}

# 1. The run ------------------------------------------------------------------------------
echo "== demo inputs and a $STEPS-step run in $DIR"
"$BIN/ppoflow" make-demo-data "$DIR/data"
"$BIN/ppoflow" make-tiny-model "$DIR/model" 2>/dev/null
"$BIN/ppoflow" train configs/demo-cpu.yaml \
    "data.train_files=[$DIR/data/train.parquet]" "data.val_files=[$DIR/data/val.parquet]" \
    "actor_rollout_ref.model.path=$DIR/model" "ppoflow.artifact_dir=$DIR/runs" \
    "trainer.default_local_dir=$DIR/checkpoints" "trainer.total_training_steps=$STEPS" \
    "trainer.test_freq=$TEST_FREQ" "trainer.save_freq=$STEPS" | tee "$DIR/train.out"
RUN_DIR=$(tail -n 1 "$DIR/train.out")
RUN_NAME=$(basename "$RUN_DIR")
RUN_ID=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["mlflow_run_id"])' "$RUN_DIR/run_info.json")
echo "run $RUN_DIR, MLflow run $RUN_ID"

# 2. The two UIs ---------------------------------------------------------------------------
echo "== MLflow UI on :$MLFLOW_PORT, Prefect UI on :$PREFECT_PORT"
setsid "$BIN/mlflow" server --backend-store-uri "sqlite:///$DIR/runs/mlflow.db" \
    --default-artifact-root "$DIR/runs/mlflow-artifacts" \
    --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 > "$DIR/mlflow-server.log" 2>&1 &
pids+=($!)
# PREFECT_UI_API_URL: without it the UI asks the default port 4200 for its data
PREFECT_UI_API_URL=http://127.0.0.1:$PREFECT_PORT/api \
    setsid "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT" \
    > "$DIR/prefect-server.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$MLFLOW_PORT/health" 180
wait_http "http://127.0.0.1:$PREFECT_PORT/api/health" 180

# the ids the pages need: experiment, flow run, the last step's report
read -r EXP_ID FLOW_RUN_ID ARTIFACT_ID LAST_STEP ZOOM < <("$PY" - "$MLFLOW_PORT" "$PREFECT_PORT" "$RUN_NAME" "$RUN_DIR" <<'EOF'
import json, math, sys, urllib.request
mlflow_port, prefect_port, run_name, run_dir = sys.argv[1:]
info = json.load(open(f"{run_dir}/run_info.json"))

def get(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))

exp = get(f"http://127.0.0.1:{mlflow_port}/api/2.0/mlflow/experiments/get-by-name"
          f"?experiment_name={info['mlflow_experiment']}")["experiment"]["experiment_id"]
api = f"http://127.0.0.1:{prefect_port}/api"
flow_run = get(f"{api}/flow_runs/filter", {"flow_runs": {"name": {"any_": [run_name]}}})[0]
last = get(f"{api}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}},
                                       "sort": "CREATED_DESC", "limit": 1})[0]  # the last step's
# wheel steps that zoom the flow run's timeline from the whole run to about 6 s (a few steps):
# each step of 200 px shows about 0.735 of the span before it
zoom = max(0, min(20, round(math.log(max(flow_run["total_run_time"], 6) / 6) / -math.log(0.735))))
print(exp, flow_run["id"], last["id"], last["key"].rsplit("-", 1)[1], zoom)
EOF
)
echo "experiment $EXP_ID, flow run $FLOW_RUN_ID, report of step $LAST_STEP: artifact $ARTIFACT_ID"
VAL_STEP=$(( STEPS / TEST_FREQ * TEST_FREQ ))
VAL_FILE=$(printf 'val_generations/step_%06d.json' "$VAL_STEP")

# 3. The screenshots -----------------------------------------------------------------------
M=http://127.0.0.1:$MLFLOW_PORT/#/experiments/$EXP_ID
P=http://127.0.0.1:$PREFECT_PORT
ML='workflowType=machine_learning'  # MLflow 3.17 opens every page in GenAI mode otherwise
SEARCH_SCORE="(() => { const i = document.querySelector('input[placeholder=\"Search metric charts\"]');
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(i, 'score');
  i.dispatchEvent(new Event('input', {bubbles: true})); return true; })()"
"$PY" - > "$DIR/shots.json" <<EOF
import json
print(json.dumps({
  # MLflow 3.17 opens its Assistant panel and a "Detect issues" tip on a first visit: closed here
  "origin_storage": {"http://127.0.0.1:$MLFLOW_PORT/": {
      "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
      "mlflow.assistant.panelOpen_v1": False,
      "mlflow.detectIssues.guidanceShown_v1": True}},
  "shots": [
    {"file": "mlflow-experiment.png", "url": "$M/runs?$ML", "wait_text": "grpo-tiny",
     "clip_height": 420},
    {"file": "mlflow-headline.png",
     "url": "$M/runs?compareRunsMode=CHART&viewStateShareKey=ppoflow-headline&$ML",
     "wait_text": "Headline", "height": 1100, "settle_s": 8},
    {"file": "mlflow-charts.png", "url": "$M/runs/$RUN_ID/model-metrics?$ML",
     "wait_text": "entropy", "actions": [{"js": """$SEARCH_SCORE"""}, {"wait_text": "critic/score"},
                                          {"sleep": 4}]},
    {"file": "mlflow-description.png", "url": "$M/runs/$RUN_ID?$ML", "wait_text": "Description",
     "height": 1400, "actions": [{"click_text": "Show more"}]},
    {"file": "mlflow-val-table.png", "url": "$M/runs/$RUN_ID/artifacts/$VAL_FILE?$ML",
     "wait_text": "ground_truth", "clip_height": 620},
    {"file": "mlflow-plots.png", "url": "$M/runs/$RUN_ID/artifacts/plots/reward.png?$ML",
     "wait_text": "reward.png", "clip_height": 640},
    {"file": "mlflow-system-metrics.png", "url": "$M/runs/$RUN_ID/system-metrics?$ML",
     "wait_text": "cpu_utilization_percentage"},
    {"file": "prefect-flow-run.png", "url": "$P/runs/flow-run/$FLOW_RUN_ID", "wait_text": "Task Runs",
     "settle_s": 6, "actions": [{"wheel": [700, 300, -200, $ZOOM]}, {"click_text": "Task Runs"},
                                {"js": "window.scrollTo(0, 0)"}]},
    {"file": "prefect-step-report.png", "url": "$P/artifacts/artifact/$ARTIFACT_ID",
     "wait_text": "validation score", "height": 1300, "settle_s": 5},
  ]}, indent=1))
EOF

cat > "$DIR/cdp.py" <<'EOF'
"""Screenshots of single-page apps with headless Chromium over the DevTools protocol.

python cdp.py SHOTS.json OUT_DIR. Each shot: file, url, wait_text (the page is photographed
settle_s seconds after this text appears), height (viewport, default 950), clip_height, actions
(js, click_text, wheel [x, y, deltaY, times], sleep, wait_text). origin_storage: localStorage entries set
on an origin before the shots."""

import base64, json, os, shutil, signal, subprocess, sys, tempfile, time, urllib.request

from websockets.sync.client import connect

WIDTH = 1500
CLICK_TEXT = """(() => {
  const want = %s;
  const hits = [...document.querySelectorAll('body *')]
    .filter(e => e.offsetParent !== null && e.textContent.trim() === want);
  const el = hits[hits.length - 1];
  if (el) { el.scrollIntoView({block: 'center'}); el.click(); }
  return !!el;
})()"""


class Page:
    def __init__(self, ws_url):
        self.ws = connect(ws_url, max_size=64 * 2**20, open_timeout=30)
        self.next_id = 0

    def call(self, method, timeout=60, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        end = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, end - time.monotonic())))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        return res.get("result", {}).get("value")

    def goto(self, url):
        self.call("Page.navigate", url=url)

    def wait_text(self, text, timeout):
        end = time.monotonic() + timeout
        probe = f"!!(document.body && document.body.innerText.includes({json.dumps(text)}))"
        while time.monotonic() < end:
            if self.eval(probe):
                return True
            time.sleep(0.5)
        return False


def act(page, action):
    kind, arg = next(iter(action.items()))
    if kind == "js":
        page.eval(arg)
    elif kind == "click_text":
        if not page.eval(CLICK_TEXT % json.dumps(arg)):
            print(f"  nothing to click named {arg!r}", file=sys.stderr)
    elif kind == "sleep":
        time.sleep(arg)
    elif kind == "wait_text":
        if not page.wait_text(arg, 60):
            print(f"  no {arg!r} after the actions", file=sys.stderr)
    elif kind == "wheel":
        x, y, dy, times = arg
        page.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for _ in range(times):
            page.call("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0, deltaY=dy)
            time.sleep(0.2)


def main():
    spec = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    port = int(os.environ.get("CDP_PORT", "9333"))
    profile = tempfile.mkdtemp(prefix="shots-chromium-")
    proc = subprocess.Popen(
        [os.environ.get("CHROMIUM", "chromium"), "--headless=new", "--no-sandbox", "--disable-gpu",
         "--hide-scrollbars", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
         f"--window-size={WIDTH},950", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    failed = 0
    try:
        ws_url = None
        for _ in range(120):
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2))
                ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                break
            except Exception:
                time.sleep(0.5)
        if ws_url is None:
            sys.exit("chromium did not start")
        page = Page(ws_url)
        page.call("Page.enable")
        for origin, items in spec.get("origin_storage", {}).items():
            page.goto(origin)
            time.sleep(3)
            for key, value in items.items():
                page.eval(f"localStorage.setItem({json.dumps(key)}, {json.dumps(json.dumps(value))})")
        for shot in spec["shots"]:
            height = shot.get("height", 950)
            page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height,
                      deviceScaleFactor=1, mobile=False)
            page.goto("about:blank")
            time.sleep(0.3)
            page.goto(shot["url"])
            ok = page.wait_text(shot["wait_text"], shot.get("timeout_s", 120))
            time.sleep(shot.get("settle_s", 4))
            for action in shot.get("actions", []):
                act(page, action)
            if shot.get("actions"):
                time.sleep(3)
            clip = {"x": 0, "y": 0, "width": WIDTH, "height": shot.get("clip_height", height), "scale": 1}
            data = page.call("Page.captureScreenshot", format="png", clip=clip)["data"]
            path = os.path.join(out, shot["file"])
            with open(path, "wb") as f:
                f.write(base64.b64decode(data))
            failed += not ok
            status = "ok" if ok else f"TIMED OUT waiting for {shot['wait_text']!r}"
            print(f"{path}  {os.path.getsize(path) // 1024} KB  {status}  {shot['url']}")
    finally:  # Chromium and its helper processes: the session it leads
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)  # helpers that outlive the browser process
        shutil.rmtree(profile, ignore_errors=True)
    sys.exit(1 if failed else 0)


main()
EOF
echo "== screenshots into $OUT"
"$PY" "$DIR/cdp.py" "$DIR/shots.json" "$OUT"

# 4. Stop the servers (the EXIT trap also does, and removes $DIR) ---------------------------
stop_servers
echo "done: $(date -u +%Y-%m-%dT%H:%MZ), run $RUN_NAME ($STEPS steps), MLflow run $RUN_ID, flow run $FLOW_RUN_ID"
