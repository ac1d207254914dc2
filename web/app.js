/*
 * sluice dashboard: jobs list, live records/s bars (uPlot), per-task backpressure strips, flow
 * control (pause / resume / rate limit / drain, with expiry), the job's control history and the
 * firing alerts. Talks only to this sluice (relative URLs, so it also works under a path prefix):
 *
 *   api/v1/flow/stream?job=J            SSE: the 5-minute window, then the changed seconds each second
 *   api/v1/control/jobs[/J[/history]]   states and history; POST .../J/<action> to change
 *   api/v1/control/stream?job=J         SSE: control changes as they happen
 *   api/v1/label/job_name/values        jobs that pushed Flink metrics
 *   api/v1/alerts                       alerts
 *   api/v1/availability?job=J&range=R   availability (24 h, 30 d) and recent gaps from heartbeats
 *   api/v1/query_range                  job health: checkpoints, restarts, GC (HEALTH_PANELS)
 *
 * The API token lives in sessionStorage only (gone when the tab closes). All text from the
 * server goes into the page through textContent, never as HTML.
 */
(function () {
  "use strict";

  const WINDOW_S = 300;
  const CELL_S = 5; // one strip cell = 5 seconds (the max within them)
  const $ = (id) => document.getElementById(id);
  const MODE_TEXT = { running: "running", paused: "paused", rate_limited: "rate limited", draining: "draining" };

  const state = {
    jobs: new Map(), // name -> {mode, hasData}
    job: null,
    flowES: null,
    ctlES: null,
    end: 0, // newest second received
    complete: null,
    recIn: new Map(), // second -> value|null
    recOut: new Map(),
    tasks: new Map(), // task name -> {subtasks, bp: Map(second -> ratio|null)}
    lags: [],
    control: null,
    chart: null,
    pending: null, // the action waiting for confirmation
  };

  /* ---------------------------------------------------------------- helpers */

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtNum(v) {
    if (v === null || v === undefined) return "–";
    return v >= 100 ? Math.round(v).toLocaleString("en-US") : (Math.round(v * 10) / 10).toLocaleString("en-US");
  }

  function fmtTime(sec) {
    return new Date(sec * 1000).toLocaleTimeString("en-GB", { hour12: false });
  }

  function level(r) {
    if (r === null || r === undefined) return "none";
    return r < 0.1 ? "ok" : r <= 0.5 ? "low" : "high";
  }

  function authHeaders() {
    const t = sessionStorage.getItem("sluice.token");
    return t ? { Authorization: "Bearer " + t } : {};
  }

  async function getJSON(url) {
    const r = await fetch(url, { headers: authHeaders(), cache: "no-store" });
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new Error((body && body.error) || r.status + " " + r.statusText);
    return body;
  }

  function setConn(text, cls) {
    const c = $("conn");
    c.textContent = text;
    c.className = "conn " + (cls || "");
  }

  /* ---------------------------------------------------------------- jobs */

  async function refreshJobs() {
    const start = Math.floor(Date.now() / 1000) - 3600;
    const [names, ctl] = await Promise.all([
      getJSON("api/v1/label/job_name/values?match[]=flink_taskmanager_job_task_operator_numRecordsIn&start=" + start)
        .then((b) => b.data || []).catch(() => []),
      getJSON("api/v1/control/jobs").then((b) => b.jobs || []).catch(() => []),
    ]);
    const jobs = new Map();
    for (const n of names) jobs.set(n, { mode: "running", hasData: true });
    for (const s of ctl) {
      const j = jobs.get(s.job) || { hasData: false };
      j.mode = s.mode;
      jobs.set(s.job, j);
    }
    state.jobs = jobs;
    renderJobs();
    if (!state.job) {
      const want = decodeURIComponent(location.hash.slice(1));
      if (want && jobs.has(want)) selectJob(want);
      else if (jobs.size === 1) selectJob(jobs.keys().next().value);
    }
  }

  function renderJobs() {
    const ul = $("jobs");
    ul.replaceChildren();
    const names = [...state.jobs.keys()].sort();
    $("jobs-empty").hidden = names.length > 0;
    for (const n of names) {
      const j = state.jobs.get(n);
      const li = el("li");
      const b = el("button");
      b.type = "button";
      b.dataset.job = n;
      b.setAttribute("aria-current", String(n === state.job));
      const label = el("span", "job-label", n);
      label.title = n;
      b.append(label);
      const mode = j.hasData ? j.mode : "nodata";
      b.append(el("span", "badge " + mode, j.hasData ? MODE_TEXT[j.mode] || j.mode : "no data"));
      b.addEventListener("click", () => selectJob(n));
      li.append(b);
      ul.append(li);
    }
  }

  function selectJob(name) {
    if (state.job === name) return;
    state.job = name;
    history.replaceState(null, "", "#" + encodeURIComponent(name));
    for (const b of $("jobs").querySelectorAll("button")) b.setAttribute("aria-current", String(b.dataset.job === name));
    $("pick").hidden = true;
    $("job").hidden = false;
    $("job-name").textContent = name;
    state.recIn.clear();
    state.recOut.clear();
    state.tasks.clear();
    state.end = 0;
    state.complete = null;
    state.control = null;
    $("ctl-msg").textContent = "";
    ensureChart();
    renderFlow();
    openStreams();
    loadControl();
    loadAvailability();
    refreshHealth();
  }

  /* ---------------------------------------------------------------- flow stream */

  function openStreams() {
    if (state.flowES) state.flowES.close();
    if (state.ctlES) state.ctlES.close();
    const q = "job=" + encodeURIComponent(state.job);
    const job = state.job;
    const fes = new EventSource("api/v1/flow/stream?" + q + "&window=" + WINDOW_S + "s");
    fes.addEventListener("flow", (ev) => {
      if (state.job !== job) return;
      onFlow(JSON.parse(ev.data));
      setConn("live", "live");
    });
    fes.onerror = () => setConn("reconnecting…", "down");
    state.flowES = fes;
    const ces = new EventSource("api/v1/control/stream?" + q);
    ces.addEventListener("change", (ev) => {
      if (state.job !== job) return;
      const s = JSON.parse(ev.data);
      showControl(s);
      loadHistory();
    });
    state.ctlES = ces;
  }

  function onFlow(d) {
    for (let s = d.start, i = 0; s <= d.end; s++, i++) {
      state.recIn.set(s, d.records_in[i]);
      state.recOut.set(s, d.records_out[i]);
    }
    const seen = new Set();
    for (const t of d.tasks) {
      seen.add(t.name);
      let e = state.tasks.get(t.name);
      if (!e) state.tasks.set(t.name, (e = { subtasks: t.subtasks, bp: new Map() }));
      e.subtasks = t.subtasks;
      for (let s = d.start, i = 0; s <= d.end; s++, i++) e.bp.set(s, t.backpressure[i]);
    }
    state.end = Math.max(state.end, d.end);
    state.complete = d.complete_until;
    state.lags = d.lags;
    const oldest = state.end - WINDOW_S + 1;
    for (const m of [state.recIn, state.recOut]) for (const s of m.keys()) if (s < oldest) m.delete(s);
    for (const t of state.tasks.values()) for (const s of t.bp.keys()) if (s < oldest) t.bp.delete(s);
    if (d.control) showControl(d.control);
    renderFlow();
  }

  function ensureChart() {
    if (state.chart) return;
    const box = $("chart");
    const bars = uPlot.paths.bars({ size: [0.8, 12], gap: 1 });
    const opts = {
      width: Math.max(320, box.clientWidth),
      height: 260,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(10, max * 1.1)] } },
      axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => fmtNum(v)) }],
      series: [
        {},
        { label: "records in/s", fill: "rgba(11,92,213,0.55)", stroke: "#0b5cd5", width: 0, paths: bars, points: { show: false } },
        { label: "records out/s", stroke: "#cf5a00", width: 1.5, points: { show: false } },
      ],
    };
    state.chart = new uPlot(opts, [[], [], []], box);
    new ResizeObserver(() => {
      if (state.chart) state.chart.setSize({ width: Math.max(320, box.clientWidth), height: 260 });
    }).observe(box);
  }

  function renderFlow() {
    const end = state.end;
    const xs = [], ins = [], outs = [];
    if (end) {
      for (let s = end - WINDOW_S + 1; s <= end; s++) {
        xs.push(s);
        const a = state.recIn.get(s), b = state.recOut.get(s);
        ins.push(a === undefined ? null : a);
        outs.push(b === undefined ? null : b);
      }
    }
    if (state.chart) state.chart.setData([xs, ins, outs]);
    renderSummary(xs, ins, outs);
    renderBackpressure();
  }

  function renderSummary(xs, ins, outs) {
    let first = -1, last = -1, sum = 0, cnt = 0, peak = 0;
    for (let i = 0; i < xs.length; i++) {
      if (ins[i] === null) continue;
      if (first < 0) first = i;
      last = i;
      sum += ins[i];
      cnt++;
      peak = Math.max(peak, ins[i]);
    }
    const summary = last < 0
      ? "No complete second yet: TaskManagers report every few seconds."
      : `At ${fmtTime(xs[last])} (the newest second every TaskManager has reported): ` +
        `${fmtNum(ins[last])} records in/s, ${fmtNum(outs[last])} out/s. ` +
        `Last 5 minutes: average ${fmtNum(sum / cnt)} in/s, peak ${fmtNum(peak)} in/s.`;
    $("chart-summary").textContent = summary;
    $("chart").setAttribute("aria-label", "Bar chart of records per second. " + summary);
    const tb = $("chart-table").tBodies[0];
    tb.replaceChildren();
    for (let i = Math.max(first, last - 29); i <= last && last >= 0; i++) {
      const tr = el("tr");
      tr.append(el("td", "", fmtTime(xs[i])), el("td", "num", fmtNum(ins[i])), el("td", "num", fmtNum(outs[i])));
      tb.prepend(tr);
    }
  }

  function renderBackpressure() {
    const box = $("bp");
    box.replaceChildren();
    const names = [...state.tasks.keys()].sort();
    $("bp-empty").hidden = names.length > 0 || !state.end;
    const first = state.end - WINDOW_S + 1;
    for (const n of names) {
      const t = state.tasks.get(n);
      let now = null;
      for (let s = state.end; s >= first && now === null; s--) {
        const v = t.bp.get(s);
        if (v !== undefined && v !== null) now = v;
      }
      const row = el("div", "bp-row");
      const name = el("span", "bp-name", n);
      name.title = `${n} (${t.subtasks} subtask${t.subtasks === 1 ? "" : "s"})`;
      const lv = level(now);
      const badge = el("span", "bp-level " + lv, lv === "none" ? "–" : lv.toUpperCase());
      badge.title = now === null ? "no value" : `${Math.round(now * 100)}% of time backpressured (max over subtasks)`;
      const strip = el("div", "strip");
      strip.setAttribute("role", "img");
      let high = 0, low = 0;
      for (let c = 0; c < WINDOW_S / CELL_S; c++) {
        let m = null;
        for (let s = first + c * CELL_S; s < first + (c + 1) * CELL_S; s++) {
          const v = t.bp.get(s);
          if (v !== undefined && v !== null) m = m === null ? v : Math.max(m, v);
        }
        const cl = level(m);
        if (cl === "high") high++;
        else if (cl === "low") low++;
        const cell = el("span", "cell " + cl);
        cell.title = `${fmtTime(first + c * CELL_S)}: ${m === null ? "no value" : Math.round(m * 100) + "%"}`;
        strip.append(cell);
      }
      strip.setAttribute("aria-label", `${n}: backpressure ${lv === "none" ? "unknown" : lv.toUpperCase()} now; ` +
        `in the last 5 minutes ${high * CELL_S} s HIGH, ${low * CELL_S} s LOW`);
      row.append(name, badge, strip);
      box.append(row);
    }
    const lags = $("lags");
    lags.replaceChildren();
    for (const l of state.lags || []) {
      let v = null;
      for (let i = l.values.length - 1; i >= 0 && v === null; i--) v = l.values[i];
      lags.append(el("div", "", `${l.name.replace(/^flink_taskmanager_job_task_operator_/, "")}: ${fmtNum(v)}`));
    }
  }

  /* ---------------------------------------------------------------- availability */

  function fmtDur(sec) {
    if (sec < 60) return `${Math.round(sec * 10) / 10} s`;
    if (sec < 3600) return `${Math.floor(sec / 60)} min ${Math.round(sec % 60)} s`;
    return `${Math.floor(sec / 3600)} h ${Math.round((sec % 3600) / 60)} min`;
  }

  function fmtPct(a) {
    return a === null || a === undefined ? "–" : `${(Math.floor(a * 1000) / 1000).toFixed(3)}%`;
  }

  async function loadAvailability() {
    const job = state.job;
    const q = async (r) => (await getJSON("api/v1/availability?job=" + encodeURIComponent(job) + "&range=" + r)).data;
    let day = null, month = null;
    try {
      [day, month] = await Promise.all([q("24h"), q("30d")]);
    } catch (e) {
      day = month = null; // a job that never pushed through the gateway (remote write only)
    }
    if (state.job !== job) return;
    const tb = $("avail-gaps").tBodies[0];
    tb.replaceChildren();
    if (!day || !month) {
      $("avail-summary").textContent = "No push heartbeats for this job.";
      $("avail-empty").hidden = true;
      $("avail-gaps").hidden = true;
      return;
    }
    const bits = [`24 h: ${fmtPct(day.availability)}`, `30 d: ${fmtPct(month.availability)}`,
      `${month.gaps.count} gap${month.gaps.count === 1 ? "" : "s"} in 30 d, ${fmtDur(month.gaps.total_seconds)} in all`];
    if (month.gaps.count) bits.push(`longest ${fmtDur(month.gaps.longest_seconds)}`);
    if (month.expected) bits.push(month.up ? "expected: up" : "expected: MISSING");
    $("avail-summary").textContent = bits.join(" · ");
    const gaps = month.recent_gaps || [];
    $("avail-gaps").hidden = gaps.length === 0;
    $("avail-empty").hidden = gaps.length > 0;
    for (const g of gaps) {
      const tr = el("tr");
      tr.append(el("td", "", new Date(g.start * 1000).toLocaleString("en-GB")),
        el("td", "", g.open ? "ongoing" : new Date(g.end * 1000).toLocaleString("en-GB")),
        el("td", "num", fmtDur(g.seconds)), el("td", "", g.open ? "–" : g.end_reason || ""));
      tb.append(tr);
    }
  }

  /* ---------------------------------------------------------------- control */

  function showControl(s) {
    state.control = s;
    const m = $("job-mode");
    m.className = "badge " + s.mode;
    m.textContent = MODE_TEXT[s.mode] || s.mode;
    const bits = [];
    if (s.mode === "rate_limited") bits.push(`${fmtNum(s.rate_limit_per_second)} records/s`);
    if (s.mode === "draining") bits.push(s.drain.length ? "matching " + s.drain.map((d) => `${d.attribute}=~${d.regex}`).join(", ") : "all records");
    if (s.version) bits.push(`v${s.version} by ${s.updated_by}`);
    if (s.expires_at) bits.push(`until ${new Date(s.expires_at_ms).toLocaleString("en-GB")}`);
    $("job-meta").textContent = bits.join(" · ");
    const j = state.jobs.get(s.job);
    if (j && j.mode !== s.mode) {
      j.mode = s.mode;
      renderJobs();
    }
  }

  async function loadControl() {
    const job = state.job;
    try {
      const s = await getJSON("api/v1/control/jobs/" + encodeURIComponent(job));
      if (state.job === job) showControl(s);
    } catch (e) {
      if (state.job === job) ctlMsg("Cannot read the control state: " + e.message, "error");
    }
    loadHistory();
  }

  async function loadHistory() {
    const job = state.job;
    let entries = [];
    try {
      entries = (await getJSON("api/v1/control/jobs/" + encodeURIComponent(job) + "/history?limit=50")).entries || [];
    } catch (e) {
      entries = [];
    }
    if (state.job !== job) return;
    const tb = $("history").tBodies[0];
    tb.replaceChildren();
    $("hist-empty").hidden = entries.length > 0;
    for (const h of entries) {
      const tr = el("tr");
      let det = "";
      if (h.mode === "rate_limited") det = `${fmtNum(h.rate_limit_per_second)} records/s`;
      else if (h.mode === "draining") det = h.drain.length ? h.drain.map((d) => `${d.attribute}=~${d.regex}`).join(", ") : "all records";
      tr.append(
        el("td", "", new Date(h.updated_at_ms).toLocaleString("en-GB")),
        el("td", "num", String(h.version)),
        el("td", "", MODE_TEXT[h.mode] || h.mode),
        el("td", "", det),
        el("td", "", h.updated_by),
        el("td", "", h.reason || ""),
        el("td", "", h.expires_at_ms ? new Date(h.expires_at_ms).toLocaleString("en-GB") : ""),
      );
      tb.append(tr);
    }
  }

  function ctlMsg(text, cls) {
    const m = $("ctl-msg");
    m.textContent = text;
    m.className = "msg " + (cls || "");
  }

  function common() {
    const body = {};
    const reason = $("reason").value.trim();
    const dur = $("for").value.trim();
    if (reason) body.reason = reason;
    if (dur) body.for = dur;
    return body;
  }

  async function act(action, body) {
    const job = state.job;
    ctlMsg("Sending…");
    try {
      const r = await fetch("api/v1/control/jobs/" + encodeURIComponent(job) + "/" + action, {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify(body),
      });
      const b = await r.json().catch(() => null);
      if (!r.ok) {
        const why = (b && b.error) || r.status + " " + r.statusText;
        ctlMsg((r.status === 401 || r.status === 403 ? "Not allowed: " : "Refused: ") + why, "error");
        return;
      }
      if (state.job === job) {
        showControl(b);
        loadHistory();
      }
      ctlMsg(`Done: ${MODE_TEXT[b.mode] || b.mode} (version ${b.version}).`, "done");
    } catch (e) {
      ctlMsg("Cannot reach sluice: " + e.message, "error");
    }
  }

  function confirmThen(text, fn) {
    state.pending = fn;
    $("confirm-text").textContent = text;
    $("confirm").showModal();
    $("confirm-cancel").focus();
  }

  function wireControls() {
    $("btn-pause").addEventListener("click", () =>
      confirmThen(`Pause ${state.job}? Its sources stop reading until it is resumed` +
        ($("for").value.trim() ? ` or ${$("for").value.trim()} pass.` : "."), () => act("pause", common())));
    $("btn-resume").addEventListener("click", () => act("resume", common()));
    $("btn-rate").addEventListener("click", () => {
      const n = Number($("rate").value);
      if (!Number.isInteger(n) || n < 1) {
        ctlMsg("Enter a whole number of records per second (1 or more).", "error");
        $("rate").focus();
        return;
      }
      act("rate-limit", { ...common(), per_second: n });
    });
    $("btn-drain").addEventListener("click", () => {
      const attr = $("drain-attr").value.trim(), re = $("drain-re").value.trim();
      if ((attr === "") !== (re === "")) {
        ctlMsg("For a selective drain give both the attribute and the regex; leave both empty to drain everything.", "error");
        return;
      }
      const body = common();
      if (attr) body.match = [{ attribute: attr, regex: re }];
      confirmThen(attr
        ? `Drain ${state.job}? Records whose ${attr} matches ${re} are discarded, not delivered.`
        : `Drain ${state.job}? ALL its records are discarded, not delivered.`, () => act("drain", body));
    });
    $("confirm-cancel").addEventListener("click", () => $("confirm").close("cancel"));
    $("confirm-ok").addEventListener("click", () => {
      $("confirm").close("ok");
      const fn = state.pending;
      state.pending = null;
      if (fn) fn();
    });
    $("confirm").addEventListener("close", () => { state.pending = null; });
    const tok = $("token");
    tok.value = sessionStorage.getItem("sluice.token") || "";
    tok.addEventListener("change", () => {
      const v = tok.value.trim();
      if (v) sessionStorage.setItem("sluice.token", v);
      else sessionStorage.removeItem("sluice.token");
    });
  }

  /* ---------------------------------------------------------------- job health */

  // Checkpoints, restarts and GC of the selected job over the last 30 minutes, one small chart per
  // query (api/v1/query_range, 15 s steps, refreshed every 30 s). $job becomes the job name as a
  // PromQL string. GC is per TaskManager (no job_name at that scope): those running the job's tasks.
  // tests/integration/test_dashboard.py evaluates these queries against flink_gen --ops data.
  const HEALTH_RANGE_S = 1800;
  const HEALTH_STEP_S = 15;
  const HEALTH_COLORS = ["#0b5cd5", "#cf5a00", "#1a7f37", "#8250df", "#bf3989", "#6e7781"];
  const HEALTH_PANELS = [
    {
      id: "ckpt-duration",
      title: "Checkpoint duration (s)",
      query: 'max by (job_name) (flink_jobmanager_job_lastCheckpointDuration{job_name="$job"}) / 1000',
      legend: () => "last checkpoint",
    },
    {
      id: "ckpt-size",
      title: "Checkpoint size (MiB)",
      query: 'max by (job_name) (flink_jobmanager_job_lastCheckpointSize{job_name="$job"}) / 1048576',
      legend: () => "last checkpoint",
    },
    {
      id: "restarts",
      title: "Restarts (since submission)",
      query: 'max by (job_name) (flink_jobmanager_job_numRestarts{job_name="$job"})',
      legend: () => "restarts",
    },
    {
      id: "gc",
      title: "GC time share per TaskManager (%)",
      query:
        "100 * (rate(flink_taskmanager_Status_JVM_GarbageCollector_G1_Young_Generation_Time[1m])" +
        " + rate(flink_taskmanager_Status_JVM_GarbageCollector_G1_Old_Generation_Time[1m])) / 1000" +
        ' and on (tm_id) group by (tm_id) (flink_taskmanager_job_task_numRecordsInPerSecond{job_name="$job"})',
      legend: (m) => m.tm_id || "TaskManager",
    },
  ];
  const health = { charts: new Map(), timer: null };

  function promString(v) {
    return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"');
  }

  function ensureHealthPanels() {
    const box = $("health");
    if (box.childElementCount) return;
    for (const p of HEALTH_PANELS) {
      const fig = el("figure", "health-panel");
      fig.id = "health-" + p.id;
      const cap = el("figcaption", "", p.title);
      const chart = el("div", "health-chart");
      chart.setAttribute("role", "img");
      chart.setAttribute("aria-label", p.title);
      const now = el("p", "summary health-now", "–");
      fig.append(cap, chart, now);
      box.append(fig);
    }
  }

  async function refreshHealth() {
    const job = state.job;
    if (!job) return;
    ensureHealthPanels();
    const end = Math.floor(Date.now() / 1000 / HEALTH_STEP_S) * HEALTH_STEP_S;
    const start = end - HEALTH_RANGE_S;
    const xs = [];
    for (let t = start; t <= end; t += HEALTH_STEP_S) xs.push(t);
    for (const p of HEALTH_PANELS) {
      const q = p.query.split("$job").join(promString(job));
      let result = [];
      try {
        const url = `api/v1/query_range?query=${encodeURIComponent(q)}&start=${start}&end=${end}&step=${HEALTH_STEP_S}`;
        result = ((await getJSON(url)).data || {}).result || [];
      } catch (e) {
        result = [];
      }
      if (state.job !== job) return; // another job was picked meanwhile
      renderHealthPanel(p, xs, result);
    }
  }

  function renderHealthPanel(p, xs, result) {
    const fig = $("health-" + p.id);
    const box = fig.querySelector(".health-chart");
    const now = fig.querySelector(".health-now");
    const old = health.charts.get(p.id);
    if (old) old.destroy();
    health.charts.delete(p.id);
    box.replaceChildren();
    if (!result.length) {
      now.textContent = "No data for this job.";
      return;
    }
    const index = new Map(xs.map((t, i) => [t, i]));
    const data = [xs];
    const series = [{}];
    const latest = [];
    result.slice(0, HEALTH_COLORS.length).forEach((r, i) => {
      const ys = new Array(xs.length).fill(null);
      for (const [t, v] of r.values) {
        const k = index.get(Math.round(Number(t)));
        if (k !== undefined) ys[k] = Number(v);
      }
      data.push(ys);
      const label = p.legend(r.metric || {});
      series.push({ label, stroke: HEALTH_COLORS[i], width: 1.5, points: { show: false } });
      const last = r.values.length ? Number(r.values[r.values.length - 1][1]) : null;
      latest.push(`${label} ${fmtNum(last)}`);
    });
    now.textContent = "Now: " + latest.join(" · ");
    const opts = {
      width: Math.max(280, box.clientWidth),
      height: 160,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      axes: [{}, { size: 60, values: (u, vals) => vals.map((v) => fmtNum(v)) }],
      series,
    };
    health.charts.set(p.id, new uPlot(opts, data, box));
  }

  /* ---------------------------------------------------------------- alerts */

  async function refreshAlerts() {
    let alerts = [];
    try {
      alerts = ((await getJSON("api/v1/alerts")).data || {}).alerts || [];
    } catch (e) {
      alerts = [];
    }
    const firing = alerts.filter((a) => a.state === "firing");
    const ul = $("alerts");
    ul.replaceChildren();
    $("alerts-empty").hidden = firing.length > 0;
    for (const a of firing) {
      const l = a.labels || {};
      const what = Object.entries(l).filter(([k]) => k !== "alertname").map(([k, v]) => `${k}="${v}"`).join(", ");
      const li = el("li");
      li.append(el("strong", "", l.alertname || "alert"), document.createTextNode(what ? ` {${what}}` : ""));
      if (a.annotations && a.annotations.summary) li.append(document.createTextNode(" — " + a.annotations.summary));
      ul.append(li);
    }
  }

  /* ---------------------------------------------------------------- start */

  function start() {
    wireControls();
    refreshJobs();
    refreshAlerts();
    setInterval(refreshJobs, 5000);
    setInterval(() => { if (state.job) loadAvailability(); }, 15000);
    setInterval(refreshAlerts, 15000);
    setInterval(refreshHealth, 30000);
    setConn("idle");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
