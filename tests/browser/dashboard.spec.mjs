// The dashboard in a real browser: Debian's headless Chromium driven by playwright-core.
//
// usage: node dashboard.spec.mjs --url http://127.0.0.1:PORT --screenshot OUT.png
//                                [--job orders_etl] [--chromium /usr/bin/chromium]
//
// tests/integration/test_dashboard_browser.py starts sluice, pushes a synthetic Flink job every
// second from two TaskManagers (one task backpressured HIGH, one OK) and runs this script against
// it. The script opens the dashboard, clicks the job, waits for non-zero bars and the two
// backpressure rows, presses Pause, checks that nothing changed before the dialog is confirmed,
// confirms, checks the new state in the page (badge, history, jobs list) and in
// GET /api/v1/control/jobs/J, and writes a full-page screenshot. Any console error, uncaught page
// exception, failed request, HTTP error response or Content-Security-Policy violation fails it.
//
// Output: one "ok: ..." line per step, then a single "RESULT {json}" line with what was seen,
// which the Python side checks again. Exit status 0 when every step passed, 1 otherwise (the
// reason on stderr as "FAIL: ..."), 2 on bad arguments.
//
// Playwright never downloads a browser here: executablePath points at Debian's chromium, which
// deploy/install-deps.sh installs; playwright-core is pinned by tests/browser/package-lock.json.
import { chromium } from 'playwright-core';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const WAIT_MS = 30000;

let opts;
try {
  opts = parseArgs({
    options: {
      url: { type: 'string' },
      screenshot: { type: 'string' },
      job: { type: 'string', default: 'orders_etl' },
      chromium: { type: 'string', default: process.env.CHROMIUM || '/usr/bin/chromium' },
    },
  }).values;
  if (!opts.url || !opts.screenshot) throw new Error('--url and --screenshot are required');
} catch (e) {
  process.stderr.write(`usage: node dashboard.spec.mjs --url URL --screenshot PATH [--job J] [--chromium PATH]\n${e.message}\n`);
  process.exit(2);
}
const base = opts.url.replace(/\/+$/, '');
const JOB = opts.job;
const jobButton = `#jobs button[data-job=${JSON.stringify(JOB)}]`;

class Failure extends Error {}

function check(cond, what, detail) {
  if (!cond) throw new Failure(`${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
}

function ok(msg) {
  process.stdout.write(`ok: ${msg}\n`);
}

// Polls fn (evaluated in the page) until it returns something truthy; the failure names the step.
async function waitFor(page, what, fn, arg) {
  try {
    return await (await page.waitForFunction(fn, arg, { timeout: WAIT_MS, polling: 200 })).jsonValue();
  } catch (e) {
    throw new Failure(`timed out waiting for ${what} (${e.message.split('\n')[0]})`);
  }
}

async function controlState() {
  const r = await fetch(`${base}/api/v1/control/jobs/${encodeURIComponent(JOB)}`);
  check(r.status === 200, 'GET /api/v1/control/jobs/J status', r.status);
  return r.json();
}

let closing = false; // set while the browser shuts down
const problems = []; // console errors, page exceptions, failed requests, CSP violations
const result = {};
let browser;

async function run() {
  browser = await chromium.launch({
    executablePath: opts.chromium,
    headless: true,
    args: ['--disable-gpu', '--no-first-run', '--disable-extensions', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-default-apps', '--no-pings',
      '--disable-domain-reliability', '--mute-audio'],
  });
  result.browser = browser.version();
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();

  // Collect everything that counts as a page error. "Failed to load resource" and CSP
  // "Refused to ..." messages arrive as console errors; requestfailed and the HTTP status catch
  // the same failures without relying on Chromium's wording, and the securitypolicyviolation
  // listener (installed before any page script runs) catches CSP violations that are not logged.
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'assert') problems.push(`console.${m.type()}: ${m.text()} ${m.location().url || ''}`.trim());
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.stack || e.message}`));
  page.on('requestfailed', (r) => {
    // The flow stream is an EventSource the page keeps open; closing the browser aborts it.
    if (!closing) problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText || ''}`);
  });
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });
  await context.addInitScript(() => {
    window.__cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || '(inline)'} at ${e.sourceFile}:${e.lineNumber}`);
    });
  });

  const resp = await page.goto(base + '/', { waitUntil: 'load' });
  check(resp && resp.status() === 200, 'GET / status', resp && resp.status());
  result.csp = resp.headers()['content-security-policy'] || null;
  check(result.csp, 'GET / sends a Content-Security-Policy header');
  ok(`dashboard loaded in ${result.browser}`);

  await page.locator(jobButton).waitFor({ state: 'visible', timeout: WAIT_MS }).catch((e) => {
    throw new Failure(`job ${JOB} not in the jobs list (${e.message.split('\n')[0]})`);
  });
  await page.locator(jobButton).click(); // a real mouse click, after Playwright's actionability checks
  const name = await page.locator('#job-name').textContent();
  check(name === JOB, 'selected job name', name);
  ok(`job ${JOB} listed and selected`);

  // Live bars: the uPlot canvas is there and the text alternative reports non-zero records/s.
  result.summary = await waitFor(page, 'non-zero bars', () => {
    const t = document.getElementById('chart-summary').textContent;
    return /records in\/s/.test(t) && !/ 0 records in/.test(t) ? t : null;
  });
  check(await page.locator('#chart canvas').count() > 0, 'a uPlot canvas in #chart');
  result.rows = await page.$$eval('#chart-table tbody tr', (rs) => rs.map((r) => [...r.cells].map((c) => c.textContent)));
  check(result.rows.length > 0 && result.rows.every((r) => parseFloat(r[1].replace(/,/g, '')) > 0),
    'every chart table row has non-zero records in/s', result.rows);
  // 2 TaskManagers x 2 tasks x 2 subtasks x 2 operators, each +1000 per push: 16,000 per second
  // when pushes are one second apart, less when one slips into the next second.
  const m = /([\d,.]+) records in\/s/.exec(result.summary);
  result.recordsInPerSec = m ? parseFloat(m[1].replace(/,/g, '')) : NaN;
  check(result.recordsInPerSec > 0 && result.recordsInPerSec <= 16000, 'records in/s within (0, 16000]', result.summary);
  ok(`bars: ${result.summary.trim()}`);

  // Backpressure strips: the sink task HIGH, the source OK, with coloured cells.
  await waitFor(page, 'two backpressure rows', () => document.querySelectorAll('#bp .bp-row').length === 2);
  result.levels = await page.$$eval('#bp .bp-row', (rs) => Object.fromEntries(rs.map((r) =>
    [r.querySelector('.bp-name').textContent, r.querySelector('.bp-level').textContent])));
  check(JSON.stringify(result.levels) === JSON.stringify({ 'Source: Orders -> Map': 'OK', 'Window -> Sink: Warehouse': 'HIGH' }),
    'backpressure levels', result.levels);
  check(await page.locator('#bp .cell.high').count() > 0, 'HIGH cells in the heat strip');
  check(await page.locator('#bp .cell.ok').count() > 0, 'OK cells in the heat strip');
  ok(`backpressure: ${JSON.stringify(result.levels)}`);

  // Pause: a confirmation first, nothing changes until it is confirmed.
  await page.locator('#reason').fill('browser test');
  await page.locator('#btn-pause').click();
  await waitFor(page, 'the confirmation dialog', () => document.getElementById('confirm').open);
  const before = await controlState();
  check(before.mode === 'running', 'state while the dialog is open', before);
  ok('pause asks for confirmation; job still running');
  await page.locator('#confirm-ok').click();
  await waitFor(page, 'the paused badge', () => document.getElementById('job-mode').textContent === 'paused');
  result.state = await controlState();
  check(result.state.mode === 'paused' && result.state.reason === 'browser test', 'state after confirming', result.state);
  await waitFor(page, 'the history row', () => document.querySelectorAll('#history tbody tr').length === 1);
  await waitFor(page, 'the paused badge in the jobs list',
    (sel) => document.querySelector(sel + ' .badge')?.textContent === 'paused', jobButton);
  ok('paused: badge, history and jobs list updated; API says paused');

  await page.waitForTimeout(1500); // one more flow event, so the screenshot shows the live state
  const png = await page.screenshot({ fullPage: true });
  writeFileSync(opts.screenshot, png);
  result.screenshotBytes = png.length;
  check(png.length > 10000, 'screenshot size', png.length);
  ok(`screenshot ${opts.screenshot} (${png.length} bytes)`);

  const csp = await page.evaluate(() => window.__cspViolations);
  for (const v of csp) problems.push(`CSP violation: ${v}`);
  check(problems.length === 0, 'page errors', problems);
  ok('no console errors, failed requests or CSP violations');
}

let status = 0;
try {
  await run();
} catch (e) {
  status = 1;
  process.stderr.write(`FAIL: ${e instanceof Failure ? e.message : e.stack || e}\n`);
  if (problems.length) process.stderr.write(`page errors so far:\n  ${problems.join('\n  ')}\n`);
} finally {
  closing = true;
  if (browser) await browser.close().catch(() => {});
}
result.passed = status === 0;
process.stdout.write(`RESULT ${JSON.stringify(result)}\n`);
process.exit(status);
