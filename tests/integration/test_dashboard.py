"""The dashboard and the state commands against a real head (``rtml start --head``: Redis,
the head supervisor, the head service, a node manager and the dashboard as daemons over
TCP) and a second node (``rtml start --address``: its own node manager, over TCP),
after a driver ran tasks, an actor and a task on the second node, a failed task and a
large object: the token on every route, cross-site posts refused, loopback by default,
what the JSON API and the CLI say, both nodes' logs, and every page in a real headless
browser (screenshots in benchmarks/dashboard/)."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest

from rtml.dashboard.app import ROUTES
from tests.integration.test_cli import (
    CLI_TIMEOUT,
    Head,
    _env,
    _free_port,
    _stop,
    rtml,
    started_head,
)

SCREENSHOTS = Path(__file__).resolve().parents[2] / "benchmarks" / "dashboard"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ERROR_TEXT = "the dashboard must show this error"
BIG_BYTES = 50_000 * 8  # > 100 KiB: it lives in the node's shared memory
SHOUT_TEXT = "shout-marker printed on the second node"

WORKLOAD = f"""
import json, os, sys
import numpy as np
import rtml
rtml.init(address="auto", log_to_driver=False)  # (stdout: the test's answers)

@rtml.remote
def square(x):
    return x * x

@rtml.remote(max_retries=0)
def explode():
    raise ValueError({ERROR_TEXT!r})

@rtml.remote(resources={{"remote": 1}})
def shout():
    print({SHOUT_TEXT!r}, flush=True)
    return os.getpid()

@rtml.remote(resources={{"remote": 1}})
class Accumulator:
    def __init__(self):
        self.total = 0

    def add(self, x):
        self.total += x
        return self.total

    def say(self, text):
        print(text, flush=True)
        return text

acc = Accumulator.options(name="accumulator").remote()
assert rtml.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
assert rtml.get(acc.add.remote(5)) == 5
failed = explode.remote()
try:
    rtml.get(failed)
except ValueError:
    pass
big = rtml.put(np.arange(50_000, dtype=np.float64))
print(json.dumps({{"failed": failed.task_id().hex(), "big": big.hex(),
                  "actor": acc._actor_id.hex(), "shout_pid": rtml.get(shout.remote())}}),
      flush=True)
for line in sys.stdin:  # the actor prints each line (the log tests follow it); "": done
    if not line.strip():
        break
    print(rtml.get(acc.say.remote(line.strip())), flush=True)
"""


@dataclass
class Dash:
    head: Head
    url: str
    ids: dict[str, Any]
    node_dir: Path  # the second node's session
    node_id: str
    driver: subprocess.Popen[str]

    def say(self, text: str) -> None:
        """Have the actor on the second node print ``text`` (to its worker's log)."""
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(text + "\n")
        self.driver.stdin.flush()
        assert self.driver.stdout.readline().strip() == text

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: str | None = None) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection(*self.host_port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return (response.status, {k.lower(): v for k, v in response.getheaders()},
                    response.read().decode())
        finally:
            conn.close()

    def api(self, path: str) -> Any:
        status, _, body = self.request("GET", path,
                                       {"Authorization": f"Bearer {self.head.token}"})
        assert status == 200, body
        return json.loads(body)

    def until(self, path: str, ok: Callable[[Any], bool], timeout: float = 20.0) -> Any:
        """The API's answer at ``path`` once ``ok`` holds for it (records are written
        in batches and node heartbeats)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.api(path)
            if ok(value) or time.monotonic() > deadline:
                return value
            time.sleep(0.25)

    def settled(self, path: str, timeout: float = 20.0) -> Any:
        """The API's answer at ``path`` once two reads a second apart agree (task
        records flush in batches; node managers' events with their heartbeats, 0.5 s)."""
        deadline = time.monotonic() + timeout
        value = self.api(path)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            value, before = self.api(path), value
            if value == before:
                break
        return value


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    cwd = tmp_path_factory.mktemp("dashboard")
    session_dir, node_dir = cwd / "head", cwd / "node"
    port = _free_port()
    started = rtml("start", "--head", "--port", str(_free_port()), "--num-cpus", "2",
                   "--dashboard-port", str(port), "--session-dir", str(session_dir), cwd=cwd)
    try:
        head = started_head(started, session_dir, cwd)
        joined = rtml("start", "--address", head.address, "--num-cpus", "1",
                      "--resources", '{"remote": 2}', "--metrics-port", "0",
                      "--session-dir", str(node_dir),
                      cwd=cwd, env=_env(RTML_TOKEN=head.token))
        assert joined.returncode == 0, joined.stderr
        node_id = json.loads((node_dir / "session.json").read_text())["node_id"]
        driver = head.driver(WORKLOAD, stdin=subprocess.PIPE)
        try:
            assert driver.stdout is not None
            line = driver.stdout.readline()
            assert line, driver.communicate(timeout=CLI_TIMEOUT)[1]
            yield Dash(head, f"http://127.0.0.1:{port}", json.loads(line), node_dir, node_id,
                       driver)
        finally:
            driver.communicate("\n", timeout=CLI_TIMEOUT)
    finally:
        if (node_dir / "session.json").exists():
            _stop(node_dir, cwd)
        _stop(session_dir, cwd)


def _dashboard_process(dash: Dash) -> psutil.Process:
    record = json.loads((dash.head.session_dir / "session.json").read_text())
    supervisor = next(p for p in record["processes"] if p["name"] == "supervisor")
    children = psutil.Process(supervisor["pid"]).children()
    return next(c for c in children if "rtml.dashboard.main" in c.cmdline())


# -- where it listens ------------------------------------------------------------------------

def test_dashboard_is_named_and_listens_on_loopback(dash: Dash) -> None:
    assert f"dashboard:      {dash.url}" in dash.head.stdout
    record = json.loads((dash.head.session_dir / "session.json").read_text())
    assert record["dashboard_url"] == dash.url
    listening = [c.laddr for c in _dashboard_process(dash).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [dash.host_port]
    status = dash.head.cli("status")
    assert status.returncode == 0, status.stderr
    assert f"Dashboard: {dash.url}" in status.stdout


def test_a_dashboard_that_dies_is_started_again_on_its_port(dash: Dash) -> None:
    first = _dashboard_process(dash)
    first.kill()
    first.wait(10)
    deadline = time.monotonic() + 20
    while True:
        try:
            status, _, _ = dash.request("GET", "/login")
            if status == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the dashboard did not come back"
        time.sleep(0.2)
    assert _dashboard_process(dash).pid != first.pid


def test_a_taken_dashboard_port_is_an_error_naming_the_flag(dash: Dash,
                                                             tmp_path: Path) -> None:
    taken = dash.host_port[1]
    result = rtml("start", "--head", "--port", "0", "--dashboard-port", str(taken),
                  "--session-dir", str(tmp_path / "other"), cwd=tmp_path)
    assert result.returncode == 1
    assert "--dashboard-port" in result.stderr and str(taken) in result.stderr
    assert "Traceback" not in result.stderr


# -- the token --------------------------------------------------------------------------------

SAMPLES = {"kind": "tasks", "id": "00" * 16, "node": "00" * 16, "name": "head.log"}


def _concrete(path: str) -> str:
    for key, value in SAMPLES.items():
        path = path.replace("{" + key + "}", value)
    return path.split("{kind:")[0] + "tasks" if "{kind:" in path else path


@pytest.mark.parametrize("method,path", [(m, _concrete(p)) for m, p, _ in ROUTES
                                         if p != "/login"])
@pytest.mark.parametrize("credentials", [
    {}, {"Authorization": "Bearer not-the-token"}, {"Cookie": "rtml_session=forged"}],
    ids=["none", "wrong-bearer", "forged-cookie"])
def test_every_route_needs_the_token(dash: Dash, method: str, path: str,
                                     credentials: dict[str, str]) -> None:
    status, headers, body = dash.request(method, path, credentials)
    if path.startswith("/api/"):
        assert status == 401, (path, body)
        assert "log in first" in json.loads(body)["error"]
    else:
        assert (status, headers.get("location")) == (302, "/login"), path
    right = dash.request(method, path, {"Authorization": f"Bearer {dash.head.token}"})[0]
    assert right in (200, 303, 404), (path, right)  # (404: the sample ids are nobody's)


def test_the_login_form_and_assets_need_no_token(dash: Dash) -> None:
    status, _, body = dash.request("GET", "/login")
    assert status == 200 and 'name="token"' in body
    assert dash.request("GET", "/static/app.js")[0] == 200
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, body = dash.request("POST", "/login", form, "token=wrong")
    assert status == 401 and "not this cluster&#x27;s token" in body
    assert "set-cookie" not in headers


def test_login_sets_a_strict_httponly_cookie_that_is_not_the_token(dash: Dash) -> None:
    host, port = dash.host_port
    status, headers, _ = dash.request(
        "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded",
                           "Origin": f"http://{host}:{port}", "Sec-Fetch-Site": "same-origin"},
        f"token={dash.head.token}")
    assert (status, headers["location"]) == (303, "/")
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert value and dash.head.token not in value
    status, _, body = dash.request("GET", "/api/cluster", {"Cookie": f"rtml_session={value}"})
    assert status == 200 and json.loads(body)["nodes"]


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}])
def test_cross_site_posts_are_refused(dash: Dash, headers: dict[str, str]) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    status, answer, body = dash.request("POST", "/login", form, f"token={dash.head.token}")
    assert status == 403 and "cross-site" in body
    assert "set-cookie" not in answer
    bearer = {**headers, "Authorization": f"Bearer {dash.head.token}"}
    assert dash.request("POST", "/logout", bearer)[0] == 403


# -- the JSON API and the CLI say the same ---------------------------------------------------

def test_api_and_cli_show_the_failed_task_with_its_traceback(dash: Dash) -> None:
    failed = dash.ids["failed"]
    rows = dash.until("/api/tasks?filter=state%3DFAILED", lambda rows: len(rows) == 1)
    assert [r["task_id"] for r in rows] == [failed]
    task = dash.until(f"/api/tasks/{failed}", lambda t: bool(t["error_message"]))
    assert task["name"] == "explode" and task["error_type"] == "TASK_EXECUTION_EXCEPTION"
    assert ERROR_TEXT in task["error_message"] and "Traceback" in task["error_message"]
    assert [(a["attempt"], a["status"]) for a in task["attempts"]] == [(0, "FAILED")]
    assert task["replay"] == f"rtml debug {failed}"
    shown = dash.head.cli("get", "task", failed)
    assert shown.returncode == 0, shown.stderr
    assert ERROR_TEXT in shown.stdout and f"rtml debug {failed}" in shown.stdout
    assert "Attempts:" in shown.stdout
    listed = dash.head.cli("list", "tasks", "--filter", "state=FAILED", "--format", "json")
    assert [r["task_id"] for r in json.loads(listed.stdout)] == [failed]


def test_list_filters_limit_and_summary(dash: Dash) -> None:
    dash.until("/api/tasks?filter=name%3Dsquare", lambda rows: len(rows) == 4)
    squares = json.loads(dash.head.cli("list", "tasks", "--filter", "name=square",
                                       "--filter", "state=FINISHED", "--format", "json").stdout)
    assert sorted(r["name"] for r in squares) == ["square"] * 4
    others = json.loads(dash.head.cli("list", "tasks", "--filter", "name!=square",
                                      "--filter", "name!=Accumulator.say",
                                      "--format", "json").stdout)
    assert sorted(r["name"] for r in others) == ["Accumulator.add", "explode", "shout"]
    one = json.loads(dash.head.cli("list", "tasks", "--limit", "1", "--format", "json").stdout)
    assert len(one) == 1
    summary = json.loads(dash.head.cli("summary", "tasks", "--format", "json").stdout)
    groups = summary["cluster"]["summary"]
    assert groups["square"]["state_counts"] == {"FINISHED": 4}
    assert groups["explode"]["state_counts"] == {"FAILED": 1}
    assert dash.api("/api/summary/tasks") == summary
    table = dash.head.cli("summary", "tasks").stdout
    assert "square" in table and "4 FINISHED" in table


def test_bad_filters_and_ids_name_the_fix(dash: Dash) -> None:
    wrong = dash.head.cli("list", "tasks", "--filter", "colour=red")
    assert wrong.returncode == 1 and "filter on one of" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    malformed = dash.head.cli("list", "actors", "--filter", "state")
    assert malformed.returncode == 1 and "KEY=VALUE or KEY!=VALUE" in malformed.stderr
    bad_id = dash.head.cli("get", "actor", "nope")
    assert bad_id.returncode == 1 and "32 hex digits" in bad_id.stderr
    unknown = dash.head.cli("get", "task", "ab" * 16)
    assert unknown.returncode == 1 and "rtml list tasks" in unknown.stderr
    status, _, body = dash.request("GET", "/api/tasks?filter=colour%3Dred",
                                   {"Authorization": f"Bearer {dash.head.token}"})
    assert status == 400 and "filter on one of" in json.loads(body)["error"]


def test_actor_and_memory(dash: Dash) -> None:
    actors = dash.until("/api/actors?detail=1", lambda rows: rows and rows[0]["pid"])
    (actor,) = actors
    assert (actor["class_name"], actor["state"], actor["name"]) == (
        "Accumulator", "ALIVE", "accumulator")
    assert psutil.pid_exists(actor["pid"]) and actor["num_restarts"] == 0
    shown = json.loads(dash.head.cli("get", "actor", actor["actor_id"], "--format",
                                     "json").stdout)
    assert shown["pid"] == actor["pid"] and shown["max_restarts"] == 0
    memory = dash.until("/api/memory", lambda m: m["total_objects"] >= 1)
    (big,) = [o for o in memory["objects"] if o["object_id"] == dash.ids["big"]]
    assert big["object_size"] >= BIG_BYTES and big["spilled"] is False
    assert list(big["locations"].values()) == ["SEALED"]
    cli = json.loads(dash.head.cli("memory", "--format", "json").stdout)
    assert cli["total_bytes"] == memory["total_bytes"] >= BIG_BYTES
    text = dash.head.cli("memory").stdout
    assert "By owner:" in text and dash.ids["big"] in text


def test_timeline_in_the_api_as_rtml_timeline_writes_it(dash: Dash) -> None:
    assert len(dash.until("/api/timeline", lambda e: len(e) >= 6)) >= 6
    events = dash.settled("/api/timeline")  # (then the CLI reads the same)
    trace = dash.head.cwd / "trace.json"
    assert dash.head.cli("timeline", "-o", str(trace)).returncode == 0
    assert sorted(e["name"] for e in json.loads(trace.read_text())) == sorted(
        e["name"] for e in events)
    status, headers, _ = dash.request("GET", "/api/timeline?download=1",
                                      {"Authorization": f"Bearer {dash.head.token}"})
    assert status == 200 and "attachment" in headers["content-disposition"]


def _second_node_out_log(dash: Dash, key: str, value: object) -> dict[str, Any]:
    """The output log (``-out.log``) on the second node of the worker whose ``key`` in
    the listing is ``value`` (its pid, or the actor it ran)."""
    (listed,) = dash.api(f"/api/logs?node={dash.node_id}")
    (found,) = [f for f in listed["files"]
                if f[key] == value and f["name"].endswith("-out.log")]
    return found  # type: ignore[no-any-return]


def test_logs_of_both_nodes_are_listed_and_read(dash: Dash) -> None:
    nodes = {n["node_id"]: n for n in dash.api("/api/logs")}
    assert len(nodes) == 2 and dash.node_id in nodes
    (head,) = [n for i, n in nodes.items() if i != dash.node_id]
    second = nodes.pop(dash.node_id)
    (address,) = [n["address"] for n in dash.api("/api/cluster")["nodes"]
                  if n["node_id"] == dash.node_id]
    assert (second["address"], second["error"]) == (address, "")  # (TCP: host:port)
    assert {"head.log", "node_manager.log", "dashboard.log"} <= {
        f["name"] for f in head["files"]}
    names = {f["name"]: f["size"] for f in second["files"]}
    assert "node_manager.log" in names and "head.log" not in names
    assert names == {p.name: p.stat().st_size for p in (dash.node_dir / "logs").iterdir()
                     if p.name in names}
    shout = _second_node_out_log(dash, "pid", dash.ids["shout_pid"])
    chunk = dash.api(f"/api/logs/{dash.node_id}/{shout['name']}?offset=0")
    assert SHOUT_TEXT in chunk["text"] and chunk["node_id"] == dash.node_id
    assert chunk["offset"] == 0 and chunk["next_offset"] == len(chunk["text"].encode())
    assert chunk["size"] == chunk["next_offset"]
    tail = dash.api(f"/api/logs/{dash.node_id[:8]}/{shout['name']}?offset=-10")
    assert tail["text"] == chunk["text"][-10:] and tail["offset"] == chunk["size"] - 10


def test_a_follower_gets_what_the_second_nodes_actor_prints_later(dash: Dash) -> None:
    dash.say("said before following")
    log = _second_node_out_log(dash, "actor_id", dash.ids["actor"])
    path = f"/api/logs/{dash.node_id}/{log['name']}"
    start = dash.api(f"{path}?offset=0")
    assert "said before following" in start["text"]
    at_end = dash.api(f"{path}?offset={start['next_offset']}")  # no wait: at once
    assert (at_end["text"], at_end["next_offset"]) == ("", start["next_offset"])
    with ThreadPoolExecutor(1) as pool:
        began = time.monotonic()
        waiting = pool.submit(dash.api, f"{path}?offset={start['next_offset']}&wait=20")
        time.sleep(1.0)
        assert not waiting.done()  # it waits for the file to grow
        dash.say("said while followed")
        chunk = waiting.result(timeout=30)
    assert chunk["text"] == "said while followed\n"
    assert chunk["offset"] == start["next_offset"] and time.monotonic() - began < 15


def test_bad_log_nodes_and_names_are_refused_with_the_reason(dash: Dash) -> None:
    def refused(path: str) -> tuple[int, str]:
        status, headers, body = dash.request(
            "GET", path, {"Authorization": f"Bearer {dash.head.token}"})
        assert dash.head.token not in body and "BEGIN" not in body, path
        if headers.get("content-type", "").startswith("application/json"):
            return status, json.loads(body)["error"]
        return status, body

    status, error = refused("/api/logs/feedbeef/node_manager.log")
    assert status == 404 and "no alive node with id feedbeef" in error
    assert dash.node_id[:12] in error  # (it names the alive ones)
    assert refused("/api/logs?node=feedbeef")[0] == 404
    status, error = refused(f"/api/logs/{dash.node_id}/no-such.log")
    assert status == 404 and "no log file 'no-such.log'" in error
    status, error = refused(f"/api/logs/{dash.node_id}/.hidden")
    assert status == 400 and "not a log file name" in error
    status, error = refused(f"/api/logs/{dash.node_id}/node_manager.log?offset=end")
    assert status == 400 and "?offset= takes a whole number" in error
    planted = dash.node_dir / "logs" / "planted.log"
    planted.symlink_to(dash.node_dir / "token")
    try:
        (listed,) = dash.api(f"/api/logs?node={dash.node_id}")
        assert "planted.log" not in [f["name"] for f in listed["files"]]
        assert refused(f"/api/logs/{dash.node_id}/planted.log")[0] == 404
        for name in ("..%2Ftoken", "..%2F..%2Fsession.json", "%2Fetc%2Fpasswd", "..", "token"):
            assert refused(f"/api/logs/{dash.node_id}/{name}")[0] in (400, 404), name
    finally:
        planted.unlink()


# -- every page in a real browser -----------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"no headless browser: {CHROMIUM} and {CHROMEDRIVER} are installed by "
                    f"`apt-get install chromium chromium-driver` (.ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_text(browser: Any, element_id: str, wanted: str, timeout: float = 20.0) -> str:
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        try:
            text = browser.find_element("id", element_id).text
        except (NoSuchElementException, StaleElementReferenceException):  # (redrawn)
            text = ""
        if wanted in text:
            return text
        time.sleep(0.2)
    raise AssertionError(f"#{element_id} never showed {wanted!r}; it shows {text[:500]!r} "
                         f"(at {browser.current_url}: {browser.page_source[:1500]})")


def _shot(browser: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def test_every_page_in_a_browser(dash: Dash, browser: Any) -> None:
    dash.until(f"/api/tasks/{dash.ids['failed']}", lambda t: bool(t["error_message"]))
    dash.until("/api/memory", lambda m: m["total_objects"] >= 1)
    browser.get(dash.url + "/")
    assert browser.current_url == dash.url + "/login"
    browser.find_element("id", "token").send_keys("wrong")
    browser.find_element("id", "login-button").click()
    assert "not this cluster's token" in _wait_text(browser, "login-error", "token")
    _shot(browser, "login")
    browser.find_element("id", "token").send_keys(dash.head.token)
    browser.find_element("id", "login-button").click()
    assert _wait_text(browser, "view-title", "Cluster")
    assert browser.get_cookie("rtml_session")["httpOnly"] is True

    nodes = _wait_text(browser, "nodes-table", "ALIVE")
    assert "CPU used/total" in nodes and "0 / 2" in nodes  # (an actor holds no CPU alive)
    (metrics,) = [n["metrics_address"] for n in dash.api("/api/cluster")["nodes"]
                  if n["metrics_address"]]  # (the second node's)
    assert f"http://{metrics}/metrics" in nodes
    assert "ALIVE" in _wait_text(browser, "actor-counts", "ALIVE")
    _wait_text(browser, "demand-none", "No pending demand")
    _shot(browser, "cluster")

    browser.get(dash.url + "/#jobs")
    assert "RUNNING" in _wait_text(browser, "jobs-table", "DRIVER")
    _shot(browser, "jobs")

    browser.get(dash.url + "/#tasks")
    tasks = _wait_text(browser, "tasks-table", "explode")
    assert "square" in tasks and "FAILED" in tasks and "Accumulator.add" in tasks
    browser.find_element("id", "filter-input").send_keys("state=FAILED")
    browser.find_element("css selector", "#task-filter button").click()
    filtered = _wait_text(browser, "tasks-table", "explode")
    _wait_until_gone(browser, "tasks-table", "square")
    _shot(browser, "tasks")
    assert "explode" in filtered
    browser.find_element("link text", dash.ids["failed"]).click()
    assert ERROR_TEXT in _wait_text(browser, "task-error", ERROR_TEXT)
    assert _wait_text(browser, "replay", "rtml debug") == f"rtml debug {dash.ids['failed']}"
    assert "FAILED" in _wait_text(browser, "attempts-table", "FAILED")
    _shot(browser, "task-failed")

    browser.get(dash.url + "/#actors")
    actors = _wait_text(browser, "actors-table", "Accumulator")
    assert "ALIVE" in actors and "accumulator" in actors
    _shot(browser, "actors")

    size = next(o["object_size"] for o in dash.api("/api/memory")["objects"]
                if o["object_id"] == dash.ids["big"])
    browser.get(dash.url + "/#objects")
    objects = _wait_text(browser, "objects-table", dash.ids["big"])
    assert f"{size / 1024:.1f} KiB" in objects and "SEALED" in objects
    _shot(browser, "objects")

    browser.get(dash.url + "/#timeline")
    assert "square" in _wait_text(browser, "timeline-lanes", "square")
    link = browser.find_element("id", "timeline-download").get_attribute("href")
    assert link == dash.url + "/api/timeline?download=1"
    _shot(browser, "timeline")

    browser.get(dash.url + "/#logs")
    second = f"logs-{dash.node_id}"
    assert "node_manager.log" in _wait_text(browser, second, "node_manager.log")
    _shot(browser, "logs")
    from selenium.webdriver.support.ui import Select
    Select(browser.find_element("id", "log-node")).select_by_value(dash.node_id)
    _wait_until_gone(browser, "content", "head.log")
    shout = _second_node_out_log(dash, "pid", dash.ids["shout_pid"])
    browser.find_element("link text", shout["name"]).click()
    _wait_text(browser, "log-text", SHOUT_TEXT)
    actor = _second_node_out_log(dash, "actor_id", dash.ids["actor"])
    browser.get(f"{dash.url}/#log/{dash.node_id}/{actor['name']}")
    assert _wait_text(browser, "log-name", actor["name"]) == actor["name"]
    dash.say("a line printed on the second node while the page follows")
    _wait_text(browser, "log-text", "a line printed on the second node while the page follows")
    _shot(browser, "log-follow")

    browser.get(dash.url + "/#cluster")
    _wait_text(browser, "nodes-table", "ALIVE")
    browser.find_element("id", "logout").click()
    _wait_text(browser, "login-button", "Log in")
    browser.get(dash.url + "/#tasks")
    assert browser.current_url.startswith(dash.url + "/login")  # (a redirect keeps the #)


def _wait_until_gone(browser: Any, element_id: str, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text in browser.find_element("id", element_id).text:
        assert time.monotonic() < deadline, f"#{element_id} still shows {text!r}"
        time.sleep(0.2)

