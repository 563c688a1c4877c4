#!/usr/bin/env python3
"""Loads the page that web/build.sh built (target/web) in headless Chromium and checks it works:
the tiny GPT-2 is served on WebGPU, every token equals the f64 reference's greedy choice (up to
near-ties, as the page reports), the segment map is drawn and the downloads are offered.

Standard library only: a static server on the loopback, chromedriver, and WebDriver's HTTP
protocol. Chromium's flags come from webdriver.json (WebGPU on SwiftShader).

    python3 web/check.py [--dir target/web] [--timeout 600] [--json FIGURES] [--screenshot PNG]
"""
import argparse
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"{}").get("value")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=os.path.join(ROOT, "target", "web"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", help="write the page's figures (JSON) to this file")
    parser.add_argument("--screenshot", help="write a PNG of the page, once served, to this file")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.dir, "index.html")):
        sys.exit(f"no page in {args.dir}: build it with `sh web/build.sh`")

    handler = functools.partial(QuietHandler, directory=args.dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page = f"http://127.0.0.1:{server.server_address[1]}/"

    driver_port = free_port()
    chromedriver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromedriver:
        sys.exit("chromedriver not found: apt-get install chromium-driver")
    driver = subprocess.Popen([chromedriver, f"--port={driver_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{driver_port}"
    try:
        for _ in range(100):
            try:
                call(base, "GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        with open(os.path.join(ROOT, "webdriver.json")) as file:
            capabilities = json.load(file)
        session = call(base, "POST", "/session",
                       {"capabilities": {"alwaysMatch": capabilities}})["sessionId"]
        path = f"/session/{session}"
        try:
            call(base, "POST", path + "/url", {"url": page})
            started = time.time()
            state = None
            while time.time() - started < args.timeout:
                state = call(base, "POST", path + "/execute/sync", {"script": SCRIPT, "args": []})
                if state["state"] in ("done", "failed"):
                    break
                time.sleep(1)
            elapsed = time.time() - started
            if args.screenshot:
                import base64
                png = call(base, "GET", path + "/screenshot")
                with open(args.screenshot, "wb") as file:
                    file.write(base64.b64decode(png))
        finally:
            call(base, "DELETE", path)
    finally:
        driver.terminate()
        server.shutdown()

    print(f"page: {state['state']} after {elapsed:.1f} s: {state['text']}")
    failures = []
    if state["state"] != "done":
        failures.append(f"the page did not finish serving (state {state['state']})")
    if not state["tokens"] or int(state["tokens"]) <= 0:
        failures.append("no tokens were served")
    if str(state["shown"]) != state["tokens"]:
        failures.append(f"the page lists {state['shown']} tokens, not the {state['tokens']} served")
    if "<svg" not in state["map"] or "<rect" not in state["map"]:
        failures.append("the segment map was not drawn")
    if not state["snapshot"].startswith("blob:") or not state["trace"].startswith("blob:"):
        failures.append("the downloads were not offered")
    if "Reserved memory" not in state["summary"]:
        failures.append("the memory summary was not shown")
    if state["figures"]:
        print("figures:", state["figures"])
        if args.json:
            with open(args.json, "w") as file:
                file.write(state["figures"])
    for failure in failures:
        print("FAILED:", failure)
    print(f"webpage: {1 if not failures else 0} passed, {1 if failures else 0} failed")
    sys.exit(1 if failures else 0)


SCRIPT = """
const status = document.getElementById('status');
const attr = (id, name) => (document.getElementById(id) || {getAttribute: () => ''}).getAttribute(name) || '';
return {
  state: status.dataset.state,
  text: status.textContent,
  tokens: status.dataset.tokens || '',
  equal: status.dataset.equal || '',
  map: document.getElementById('map').innerHTML.slice(0, 20000),
  summary: document.getElementById('summary').textContent,
  snapshot: attr('snapshot', 'href'),
  trace: attr('trace', 'href'),
  figures: document.getElementById('figures').textContent,
  shown: Array.from(document.querySelectorAll('#requests li')).reduce(
    (sum, li) => sum + li.textContent.split(':').pop().trim().split(/\s+/).filter(Boolean).length, 0),
};
"""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript"}

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    main()
