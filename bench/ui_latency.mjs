// The web console's live behaviour in Debian's Chromium (bench/ui_bench.sh
// runs it; tests/scripts/chromium.mjs drives the browser):
//
//   node bench/ui_latency.mjs CHROMIUM URL JOB latency SECONDS
//     For SECONDS, the time from the coordinator having a step to the job
//     page's chart showing it. The coordinator's side is the console's
//     jobs API polled every 20 ms (a step is seen there at most 20 ms plus
//     one request late, so the figure is low by up to that); the page's
//     side is the first animation frame after its summary changed (it is
//     redrawn with the charts).
//   node bench/ui_latency.mjs CHROMIUM URL JOB render SECONDS
//     The time from navigation to the loss chart drawn, then for SECONDS
//     the page's main-thread tasks over 50 ms (long tasks: what makes a
//     page feel stuck) while it keeps polling.
//
// Prints one line of figures. URL is the one `lockstep ui` printed.
import { openChromium, sleep } from '../tests/scripts/chromium.mjs';

const [chromium, url, job, mode, seconds] = process.argv.slice(2);
const base = url.slice(0, url.indexOf('/?token='));
const token = url.slice(url.indexOf('?token=') + 7);
const page = await openChromium(chromium);
const quantile = (values, q) => {
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
};
const until = async (expression) => {
  for (let i = 0; i < 1200; ++i) {
    if (await page.evaluate(expression)) return;
    await sleep(50);
  }
  console.log(`ui_latency: timed out waiting for ${expression}`);
  page.close();
  process.exit(1);
};

await page.call('Page.navigate', {url: `${url}#/job/${encodeURIComponent(job)}`});
await until(`!!document.querySelector('polyline[data-series="loss"]')`);
if (mode === 'render') {
  const first = await page.evaluate('performance.now()');
  await page.evaluate(`window.longTasks = [];
    new PerformanceObserver((list) => { for (const e of list.getEntries()) longTasks.push(e.duration); })
      .observe({type: 'longtask'});`);
  await sleep(Number(seconds) * 1000);
  const tasks = await page.evaluate('longTasks');
  const points = await page.evaluate(`document.querySelector('polyline[data-series="loss"]').getAttribute('data-points')`);
  console.log(`render: loss chart of ${points} points drawn ${first.toFixed(0)} ms after navigation; ` +
    `${tasks.length} long tasks in ${seconds} s` + (tasks.length ? `, the longest ${Math.max(...tasks).toFixed(0)} ms` : ''));
} else {
  // The page: each change of its summary's step, at the next frame.
  await page.evaluate(`window.drawn = [];
    new MutationObserver(() => {
      const m = /step (\\d+)\\//.exec(document.getElementById('summary').textContent);
      if (m) requestAnimationFrame(() => drawn.push([Number(m[1]), Date.now()]));
    }).observe(document.getElementById('summary'), {childList: true, characterData: true, subtree: true});`);
  // The coordinator: the first time the API shows each step.
  const seen = [];
  const end = Date.now() + Number(seconds) * 1000;
  while (Date.now() < end) {
    const reply = await fetch(`${base}/api/jobs`, {headers: {'X-Lockstep-Token': token}});
    const at = Date.now();
    const row = ((await reply.json()).jobs || []).find((j) => j.job_id === job);
    const step = row ? Number(row.step || 0) : 0;
    if (!seen.length || step > seen[seen.length - 1][0]) seen.push([step, at]);
    await sleep(20);
  }
  const drawn = await page.evaluate('drawn');
  const latencies = [];
  for (const [step, at] of drawn) {
    const first = seen.find(([s]) => s >= step);
    // A step the page drew before the 20 ms poll saw it counts as 0 ms.
    if (first && step > seen[0][0]) latencies.push(Math.max(0, at - first[1]));
  }
  if (!latencies.length) {
    console.log('ui_latency: the page showed no new step; is the job running?');
    page.close();
    process.exit(1);
  }
  console.log(`progress to chart: ${latencies.length} updates, median ${quantile(latencies, 0.5)} ms, ` +
    `p90 ${quantile(latencies, 0.9)} ms, max ${Math.max(...latencies)} ms (the page polls each second)`);
}
page.close();
