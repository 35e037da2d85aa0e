// Drives Debian's Chromium, headless, through the DevTools protocol, for
// the web console's tests (tests/integration/ui_test.cc): opens URL, then
// runs the steps in order, each waiting up to 60 s:
//
//   --wait SELECTOR           until an element matches
//   --click SELECTOR          clicks the first match
//   --expect SELECTOR TEXT    until the first match's text contains TEXT
//   --screenshot FILE         the page as a PNG
//   --touch FILE              writes FILE (a test waiting for this point
//                             of the run goes on, e.g. to kill a process)
//
// Prints "ok" and exits 0, or prints what failed (with the page's text)
// and exits 1, after a screenshot to $BROWSER_FAILURE_PNG when set. Exit
// 77 when Chromium cannot start. Needs Node 20 with --experimental-websocket
// (or Node 22); no packages.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [chromium, url, ...steps] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'lockstep-browser-'));
const browser = spawn(chromium, [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
  '--no-first-run', '--remote-debugging-port=0', `--user-data-dir=${profile}`,
  'about:blank'], {stdio: ['ignore', 'ignore', 'pipe']});
let stderr = '';
browser.stderr.on('data', (d) => { stderr += d; });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function finish(code, message) {
  console.log(message);
  browser.kill('SIGKILL');
  try { rmSync(profile, {recursive: true, force: true}); } catch {}
  process.exit(code);
}

// The port Chromium chose, from the file it writes into its profile.
async function debuggingPort() {
  for (let i = 0; i < 300; ++i) {
    try {
      return Number(readFileSync(join(profile, 'DevToolsActivePort'), 'utf8').split('\n')[0]);
    } catch {}
    if (browser.exitCode !== null) break;
    await sleep(100);
  }
  finish(77, `Chromium did not start: ${stderr.slice(-500)}`);
}

const port = await debuggingPort();
const targets = await (await fetch(`http://127.0.0.1:${port}/json`)).json();
const page = targets.find((t) => t.type === 'page');
const socket = new WebSocket(page.webSocketDebuggerUrl);
await new Promise((resolve, reject) => { socket.onopen = resolve; socket.onerror = reject; });
let next = 0;
const pending = new Map();
socket.onmessage = (event) => {
  const message = JSON.parse(event.data);
  if (message.id && pending.has(message.id)) {
    pending.get(message.id)(message);
    pending.delete(message.id);
  }
};
function call(method, params) {
  const id = ++next;
  socket.send(JSON.stringify({id, method, params: params || {}}));
  return new Promise((resolve) => pending.set(id, resolve));
}
async function evaluate(expression) {
  const reply = await call('Runtime.evaluate', {expression, returnByValue: true, awaitPromise: true});
  return reply.result && reply.result.result ? reply.result.result.value : undefined;
}
async function screenshot(file) {
  const shot = await call('Page.captureScreenshot', {format: 'png'});
  if (shot.result) writeFileSync(file, Buffer.from(shot.result.data, 'base64'));
}
async function until(what, test) {
  for (let i = 0; i < 600; ++i) {
    if (await test()) return;
    await sleep(100);
  }
  const text = await evaluate('document.body ? document.body.innerText : ""');
  if (process.env.BROWSER_FAILURE_PNG) await screenshot(process.env.BROWSER_FAILURE_PNG);
  finish(1, `timed out waiting for ${what}; the page says:\n${text}`);
}

await call('Page.enable');
await call('Emulation.setDeviceMetricsOverride', {width: 1200, height: 900, deviceScaleFactor: 1, mobile: false});
await call('Page.navigate', {url});
const q = (selector) => JSON.stringify(selector);
for (let i = 0; i < steps.length; ++i) {
  const step = steps[i];
  if (step === '--wait') {
    const selector = steps[++i];
    await until(selector, () => evaluate(`!!document.querySelector(${q(selector)})`));
  } else if (step === '--click') {
    const selector = steps[++i];
    await until(selector, () => evaluate(`!!document.querySelector(${q(selector)})`));
    await evaluate(`document.querySelector(${q(selector)}).click()`);
  } else if (step === '--expect') {
    const selector = steps[++i], text = steps[++i];
    await until(`${selector} to say "${text}"`, () => evaluate(
      `(document.querySelector(${q(selector)}) || {}).textContent?.includes(${q(text)}) || false`));
  } else if (step === '--screenshot') {
    await screenshot(steps[++i]);
  } else if (step === '--touch') {
    writeFileSync(steps[++i], '');
  } else {
    finish(2, `unknown step ${step}`);
  }
}
finish(0, 'ok');
