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
//   --downloads DIR           saves the page's downloads into DIR
//   --file PATH               until PATH exists, whole (a download)
//
// Prints "ok" and exits 0, or prints what failed (with the page's text)
// and exits 1, after a screenshot to $BROWSER_FAILURE_PNG when set. Exit
// 77 when Chromium cannot start (tests/scripts/chromium.mjs).
import { existsSync, mkdirSync, statSync, writeFileSync } from 'node:fs';
import { openChromium, sleep } from './chromium.mjs';

const [chromium, url, ...steps] = process.argv.slice(2);
const page = await openChromium(chromium);
const { call, evaluate, screenshot } = page;
function finish(code, message) {
  console.log(message);
  page.close();
  process.exit(code);
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
  } else if (step === '--downloads') {
    const dir = steps[++i];
    mkdirSync(dir, {recursive: true});
    const reply = await call('Page.setDownloadBehavior', {behavior: 'allow', downloadPath: dir});
    if (reply.error) finish(1, `cannot save downloads: ${reply.error.message}`);
  } else if (step === '--file') {
    const path = steps[++i];
    await until(`the file ${path}`, () => existsSync(path) && statSync(path).size > 0);
  } else {
    finish(2, `unknown step ${step}`);
  }
}
finish(0, 'ok');
