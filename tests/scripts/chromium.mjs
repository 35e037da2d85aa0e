// Debian's Chromium, headless, driven through the DevTools protocol with
// Node's own WebSocket (Node 20 with --experimental-websocket, or 22): no
// packages. Used by tests/scripts/browser.mjs (the web console's tests)
// and bench/ui_latency.mjs.
//
//   const page = await openChromium('/usr/bin/chromium');
//   await page.call('Page.navigate', {url});
//   const title = await page.evaluate('document.title');
//   page.close();
//
// Exits 77 (skipped) when Chromium cannot start.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function openChromium(chromium) {
  const profile = mkdtempSync(join(tmpdir(), 'lockstep-browser-'));
  const browser = spawn(chromium, [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
    '--no-first-run', '--remote-debugging-port=0', `--user-data-dir=${profile}`,
    'about:blank'], {stdio: ['ignore', 'ignore', 'pipe']});
  let stderr = '';
  browser.stderr.on('data', (d) => { stderr += d; });
  const close = () => {
    browser.kill('SIGKILL');
    try { rmSync(profile, {recursive: true, force: true}); } catch {}
  };

  // The port Chromium chose, from the file it writes into its profile.
  let port = 0;
  for (let i = 0; i < 300 && !port; ++i) {
    try {
      port = Number(readFileSync(join(profile, 'DevToolsActivePort'), 'utf8').split('\n')[0]);
    } catch {}
    if (port || browser.exitCode !== null) break;
    await sleep(100);
  }
  if (!port) {
    close();
    console.log(`Chromium did not start: ${stderr.slice(-500)}`);
    process.exit(77);
  }
  const targets = await (await fetch(`http://127.0.0.1:${port}/json`)).json();
  const target = targets.find((t) => t.type === 'page');
  const socket = new WebSocket(target.webSocketDebuggerUrl);
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
  const call = (method, params) => {
    const id = ++next;
    socket.send(JSON.stringify({id, method, params: params || {}}));
    return new Promise((resolve) => pending.set(id, resolve));
  };
  const evaluate = async (expression) => {
    const reply = await call('Runtime.evaluate', {expression, returnByValue: true, awaitPromise: true});
    return reply.result && reply.result.result ? reply.result.result.value : undefined;
  };
  const screenshot = async (file) => {
    const shot = await call('Page.captureScreenshot', {format: 'png'});
    if (shot.result) writeFileSync(file, Buffer.from(shot.result.data, 'base64'));
  };
  await call('Page.enable');
  await call('Emulation.setDeviceMetricsOverride', {width: 1200, height: 900, deviceScaleFactor: 1, mobile: false});
  return {call, evaluate, screenshot, close};
}
