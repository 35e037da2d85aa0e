// The web console's page (client/ui_server.h): one HTML file, its script
// and its style, plain JavaScript with no packages, so the binary holds all
// of it and it works offline. Every value from the coordinator enters the
// page as text (textContent, never innerHTML), so a job name cannot become
// markup. Routes are the URL's hash: #/jobs, #/job/ID, #/queue,
// #/workers, #/compare/A,B.

namespace lockstep::client {

const char* UiPageHtml() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lockstep</title>
<link rel="stylesheet" href="/app.css">
</head>
<body>
<header>
  <strong>lockstep</strong>
  <nav>
    <a href="#/jobs" id="nav-jobs">Jobs</a>
    <a href="#/queue" id="nav-queue">Queue</a>
    <a href="#/workers" id="nav-workers">Workers</a>
    <a href="#/compare" id="nav-compare">Compare</a>
  </nav>
  <span id="connection" class="ok">connected</span>
</header>
<main id="main"></main>
<script src="/app.js"></script>
</body>
</html>
)html";
}

const char* UiPageStyle() {
  return R"css(body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1b1f24; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1em;
  background: #24292f; color: #fff; }
header a { color: #c9d1d9; text-decoration: none; margin-right: 1em; }
header a.current { color: #fff; font-weight: bold; }
#connection { margin-left: auto; font-size: 12px; }
#connection.down { color: #ffb86c; }
main { padding: 1em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25em .6em; border-bottom: 1px solid #d0d7de; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state-RUNNING { color: #1a7f37; } .state-FAILED { color: #cf222e; }
.state-QUEUED, .state-RECOVERING { color: #9a6700; }
.filters { display: flex; gap: 1em; margin-bottom: .8em; }
.error { color: #cf222e; white-space: pre-wrap; }
.muted { color: #57606a; }
svg.chart { border: 1px solid #d0d7de; background: #fff; }
button { padding: .3em .9em; }
section { margin-bottom: 1.5em; }
)css";
}

const char* UiPageScript() {
  return R"js('use strict';
// The token of the URL `lockstep ui` printed: sent with every API call.
const token = new URLSearchParams(location.search).get('token') || '';
const main = document.getElementById('main');
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function connection(up, why) {
  const badge = document.getElementById('connection');
  badge.textContent = up ? 'connected' : 'reconnecting: ' + why;
  badge.className = up ? 'ok' : 'down';
}

async function api(path, init) {
  let response;
  try {
    response = await fetch('/api/' + path, Object.assign({
      headers: {'X-Lockstep-Token': token, 'Content-Type': 'application/json'},
      cache: 'no-store'}, init || {}));
  } catch (e) {
    connection(false, 'the console is not answering');
    throw e;
  }
  const body = await response.json().catch(() => ({error: response.statusText}));
  if (response.status === 503) connection(false, body.error || 'coordinator unreachable');
  else connection(true);
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

const num = (v) => (v === undefined || v === null || v === '') ? 0 : Number(v);
const state = (s) => (s || 'JOB_STATE_UNKNOWN').replace('JOB_STATE_', '');
function age(seconds) {
  if (!seconds) return '-';
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 120) return Math.round(s) + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}
function fixed(v, digits) { return v === undefined ? '-' : Number(v).toFixed(digits); }

// Repeats `draw` every second until the route changes.
function live(draw) {
  clearTimeout(timer);
  const route = location.hash;
  const tick = async () => {
    try { await draw(); } catch (e) { if (e.status && e.status !== 503) showError(e); }
    if (location.hash === route) timer = setTimeout(tick, 1000);
  };
  tick();
}

function showError(e) {
  let box = document.getElementById('error');
  if (!box) { box = el('p', {id: 'error', class: 'error'}); main.prepend(box); }
  box.textContent = e.message;
}

// ---- Jobs ----
const filters = {state: '', owner: '', search: ''};
function jobsPage() {
  const stateSelect = el('select', {id: 'filter-state', onchange: (e) => { filters.state = e.target.value; }},
    ...['', 'QUEUED', 'RUNNING', 'RECOVERING', 'SUCCEEDED', 'FAILED', 'STOPPED']
        .map((s) => el('option', {value: s}, s || 'any state')));
  stateSelect.value = filters.state;
  const owner = el('input', {id: 'filter-owner', placeholder: 'owner', oninput: (e) => { filters.owner = e.target.value; }});
  owner.value = filters.owner;
  const search = el('input', {id: 'filter-search', placeholder: 'search', oninput: (e) => { filters.search = e.target.value; }});
  search.value = filters.search;
  const body = el('tbody', {id: 'jobs'});
  main.replaceChildren(el('div', {class: 'filters'}, stateSelect, owner, search),
    el('table', {}, el('thead', {}, el('tr', {},
      ...['job', 'state', 'owner', 'priority', 'workers', 'step', 'loss', 'samples/s', 'age']
          .map((h) => el('th', {}, h)))), body));
  live(async () => {
    const list = await api('jobs');
    const rows = [];
    for (const job of list.jobs || []) {
      const s = state(job.state);
      const who = job.owner || job.submitted_by || '';
      if (filters.state && s !== filters.state) continue;
      if (filters.owner && !who.includes(filters.owner)) continue;
      if (filters.search && !job.job_id.includes(filters.search)) continue;
      rows.push(el('tr', {'data-job': job.job_id},
        el('td', {}, el('a', {href: '#/job/' + encodeURIComponent(job.job_id)}, job.job_id)),
        el('td', {class: 'state-' + s}, s),
        el('td', {}, who || '-'),
        el('td', {class: 'num'}, num(job.priority)),
        el('td', {class: 'num'}, num(job.world_size)),
        el('td', {class: 'num'}, num(job.step) + '/' + num(job.total_steps)),
        el('td', {class: 'num'}, fixed(job.loss, 4)),
        el('td', {class: 'num'}, fixed(job.samples_per_second, 0)),
        el('td', {class: 'num'}, age(job.submit_time))));
    }
    body.replaceChildren(...rows);
  });
}

// ---- A chart: series of [x, y] as SVG polylines ----
function chart(series, xLabel, width, height) {
  width = width || 640; height = height || 240;
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'chart');
  svg.setAttribute('width', width); svg.setAttribute('height', height);
  const points = series.flatMap((s) => s.points.filter((p) => p[1] !== null && isFinite(p[1])));
  if (points.length === 0) { svg.append(document.createTextNode('')); return svg; }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (x) => 40 + (width - 50) * (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5);
  const sy = (y) => height - 25 - (height - 35) * (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5);
  const colors = ['#0969da', '#cf222e', '#1a7f37', '#8250df'];
  series.forEach((s, i) => {
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('fill', 'none');
    line.setAttribute('stroke', colors[i % colors.length]);
    line.setAttribute('data-series', s.name);
    line.setAttribute('data-points', String(s.points.length));
    line.setAttribute('points', s.points.filter((p) => p[1] !== null && isFinite(p[1]))
        .map((p) => sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1)).join(' '));
    svg.append(line);
  });
  const label = (x, y, text) => {
    const t = document.createElementNS(ns, 'text');
    t.setAttribute('x', x); t.setAttribute('y', y); t.setAttribute('font-size', '11');
    t.textContent = text; svg.append(t);
  };
  if (series.length > 1) {  // a legend, in the lines' colours
    series.forEach((s, i) => {
      label(width - 200, 14 + 13 * i, s.name);
      svg.lastChild.setAttribute('fill', colors[i % colors.length]);
    });
  }
  label(2, 12, y1.toPrecision(4)); label(2, height - 28, y0.toPrecision(4));
  label(40, height - 8, xLabel + ' ' + x0); label(width - 90, height - 8, String(x1));
  return svg;
}

// A link that saves `text` as `name`; the links of the previous redraw are
// released first (a page redrawn every second would keep them all).
const downloads = [];
function download(name, type, text, label) {
  const link = el('a', {download: name, class: 'download'}, label);
  link.href = URL.createObjectURL(new Blob([text], {type}));
  downloads.push(link.href);
  return link;
}
// Saves an SVG chart as a PNG: drawn into a canvas through a data: URL
// (the page's policy allows data: images), then offered as a download.
function savePng(svg, name) {
  const image = new Image();
  image.onload = () => {
    const canvas = el('canvas', {width: svg.getAttribute('width'), height: svg.getAttribute('height')});
    const context = canvas.getContext('2d');
    context.fillStyle = '#fff';
    context.fillRect(0, 0, canvas.width, canvas.height);
    context.drawImage(image, 0, 0);
    canvas.toBlob((blob) => {
      const link = el('a', {download: name});
      link.href = URL.createObjectURL(blob);
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    }, 'image/png');
  };
  const text = new XMLSerializer().serializeToString(svg);
  image.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(text);
}
function releaseDownloads() { downloads.splice(0).forEach((u) => URL.revokeObjectURL(u)); }

// ---- A job ----
// An action's button: POSTs jobs/ID/ACTION and shows the coordinator's
// answer (its refusal, in its words) beside the buttons.
function action(id, name, label, done) {
  return el('button', {id: name, onclick: async () => {
    const result = document.getElementById('action-result');
    try {
      await api('jobs/' + encodeURIComponent(id) + '/' + name, {method: 'POST', body: '{}'});
      result.textContent = name + ' requested';
      result.className = 'muted';
      if (done) done();
    } catch (e) { result.textContent = e.message; result.className = 'error'; }
  }}, label);
}

function jobPage(id) {
  const head = el('h2', {}, id);
  const summary = el('p', {id: 'summary'});
  const actions = el('p', {}, action(id, 'stop', 'Stop'), ' ',
    action(id, 'delete', 'Delete', () => { location.hash = '#/jobs'; }), ' ',
    el('span', {id: 'action-result'}));
  const axis = el('select', {id: 'axis'}, ...['step', 'samples', 'epoch'].map((a) => el('option', {value: a}, 'x: ' + a)));
  const curves = el('section', {id: 'curves'});
  const events = el('tbody', {id: 'events'});
  const ranks = el('tbody', {id: 'ranks'});
  const checkpoints = el('tbody', {id: 'checkpoints'});
  main.replaceChildren(head, summary, actions, axis, curves,
    el('section', {}, el('h3', {}, 'Checkpoints'), el('table', {}, el('thead', {}, el('tr', {},
      ...['name', 'step', 'epoch', 'committed', 'bytes'].map((h) => el('th', {}, h)))), checkpoints)),
    el('section', {}, el('h3', {}, 'Ranks'), el('table', {}, el('thead', {}, el('tr', {},
      ...['rank', 'worker', 'host', 'steps', 'heartbeat'].map((h) => el('th', {}, h)))), ranks)),
    el('section', {}, el('h3', {}, 'Events'), el('table', {}, el('thead', {}, el('tr', {},
      ...['time', 'kind', 'rank', 'message'].map((h) => el('th', {}, h)))), events)));
  // The last answer drawn: the next poll asks only whether it changed.
  let data = null;
  // samples/s as the coordinator reported it at each change seen while
  // this page is open (the coordinator keeps no history of it).
  const throughput = [];
  const draw = (heartbeats) => {
    const job = data.status;
    const s = state(job.state);
    const parts = [s, 'step ' + num(job.step) + '/' + num(job.total_steps),
      'loss ' + fixed(job.loss, 4), num(job.world_size) + ' workers',
      fixed(job.samples_per_second, 0) + ' samples/s'];
    if (job.queue && job.queue.message) parts.push('waits: ' + job.queue.message);
    if (job.error) parts.push(job.error);
    summary.textContent = parts.join(' · ');
    summary.className = 'state-' + s;
    const c = data.curve;
    // The x-axis: steps, samples seen (steps x global batch) or epochs.
    const plan = job.plan || {};
    const scale = axis.value === 'samples' ? num(plan.global_batch_size) || 1
                : axis.value === 'epoch' ? 1 / (num(plan.steps_per_epoch) || 1) : 1;
    const loss = c.steps.map((x, i) => [x * scale, c.loss[i]]);
    const lr = c.steps.map((x, i) => [x * scale, c.lr[i]]);
    const evals = (job.evals || []).map((e) => [num(e.step) * scale, e.test_loss]);
    const accuracy = (job.evals || []).filter((e) => e.test_accuracy !== undefined)
        .map((e) => [num(e.step) * scale, e.test_accuracy]);
    curves.replaceChildren(
      el('h3', {}, 'Loss (' + c.steps.length + ' points)'), chart([{name: 'loss', points: loss}, {name: 'test loss', points: evals}], axis.value),
      accuracy.length ? el('h3', {}, 'Test accuracy') : null,
      accuracy.length ? chart([{name: 'test accuracy', points: accuracy}], axis.value, 640, 160) : null,
      el('h3', {}, 'Learning rate'), chart([{name: 'lr', points: lr}], axis.value, 640, 160),
      el('h3', {}, 'Samples/s (while this page is open)'),
      chart([{name: 'samples/s', points: throughput.map(([x, y]) => [x * scale, y])}], axis.value, 640, 160));
    checkpoints.replaceChildren(...(job.checkpoints || []).slice().reverse().map((k) => el('tr', {},
      el('td', {}, k.name), el('td', {class: 'num'}, num(k.step)), el('td', {class: 'num'}, num(k.epoch)),
      el('td', {}, new Date(num(k.time) * 1000).toLocaleString()), el('td', {class: 'num'}, num(k.bytes)))));
    ranks.replaceChildren(...(job.ranks || []).map((r) => el('tr', {},
      el('td', {}, num(r.rank)), el('td', {}, r.worker_id || ''), el('td', {}, r.host || ''),
      el('td', {class: 'num'}, num(r.steps)),
      el('td', {}, heartbeats[r.worker_id] ? age(heartbeats[r.worker_id]) : '-'))));
    events.replaceChildren(...(job.events || []).slice().reverse().map((e) => el('tr', {},
      el('td', {}, new Date(num(e.time) * 1000).toLocaleTimeString()), el('td', {}, e.kind),
      el('td', {}, e.rank === undefined ? '-' : e.rank), el('td', {}, e.message || ''))));
  };
  axis.addEventListener('change', () => { if (data) draw({}); });
  live(async () => {
    const since = data ? '?since=' + data.status.version : '';
    const next = await api('jobs/' + encodeURIComponent(id) + since);
    const running = !next.unchanged && ['RUNNING', 'RECOVERING'].includes(state(next.status.state));
    // Heartbeats are the workers' news, not the job's: asked while it runs.
    const heartbeats = {};
    if (running || (next.unchanged && data && ['RUNNING', 'RECOVERING'].includes(state(data.status.state)))) {
      const list = await api('workers');
      for (const w of list.workers || []) heartbeats[w.worker_id] = num(w.last_heartbeat);
    }
    if (!next.unchanged) {
      data = next;
      if (running && num(data.status.samples_per_second) > 0) {
        throughput.push([num(data.status.step), num(data.status.samples_per_second)]);
      }
    }
    draw(heartbeats);
  });
}

// ---- Queue ----
function queuePage() {
  const body = el('tbody', {id: 'queue'});
  const owners = el('tbody', {id: 'owners'});
  const rights = el('p', {class: 'muted', id: 'rights'});
  main.replaceChildren(el('table', {}, el('thead', {}, el('tr', {},
    ...['#', 'job', 'owner', 'priority', 'workers', 'waits because', 'would preempt']
        .map((h) => el('th', {}, h)))), body),
    el('h3', {}, 'Owners'), el('table', {}, el('thead', {}, el('tr', {},
      ...['owner', 'workers held', 'quota', 'active jobs', 'queued jobs'].map((h) => el('th', {}, h)))), owners),
    rights);
  live(async () => {
    const queue = await api('queue');
    body.replaceChildren(...(queue.jobs || []).map((job) => el('tr', {'data-job': job.job_id},
      el('td', {class: 'num'}, num(job.queue && job.queue.position)),
      el('td', {}, el('a', {href: '#/job/' + encodeURIComponent(job.job_id)}, job.job_id)),
      el('td', {}, job.owner || job.submitted_by || '-'),
      el('td', {class: 'num'}, num(job.priority)),
      el('td', {class: 'num'}, num(job.spec && (job.spec.num_workers || job.spec.min_workers)) || 'all'),
      el('td', {}, job.queue ? (job.queue.reason + ': ' + (job.queue.message || '')) : '-'),
      el('td', {}, job.queue && job.queue.preempts ? job.queue.preempts.join(', ') : '-'))));
    owners.replaceChildren(...(queue.owners || []).map((o) => el('tr', {'data-owner': o.owner},
      el('td', {}, o.owner || '-'), el('td', {class: 'num'}, num(o.workers)),
      el('td', {class: 'num'}, o.quota === undefined ? 'none' : num(o.quota)),
      el('td', {class: 'num'}, num(o.active_jobs)), el('td', {class: 'num'}, num(o.queued_jobs)))));
    rights.textContent = (queue.admins || []).length ? 'admins: ' + queue.admins.join(', ') : '';
  });
}

// ---- Workers ----
function workersPage() {
  const body = el('tbody', {id: 'workers'});
  main.replaceChildren(el('table', {}, el('thead', {}, el('tr', {},
    ...['worker', 'state', 'host', 'device', 'BLAS', 'labels', 'job', 'rank', 'heartbeat']
        .map((h) => el('th', {}, h)))), body));
  live(async () => {
    const list = await api('workers');
    body.replaceChildren(...(list.workers || []).map((w) => el('tr', {'data-worker': w.worker_id},
      el('td', {}, w.worker_id), el('td', {}, w.state || (w.connected ? 'connected' : 'gone')),
      el('td', {}, w.host || ''), el('td', {}, (w.device && w.device.name) || 'cpu'),
      el('td', {}, (w.device && w.device.blas_kernel) || '-'),
      el('td', {}, Object.entries(w.labels || {}).map(([k, v]) => k + '=' + v).join(', ') || '-'),
      el('td', {}, w.job_id || (w.spare ? 'spare' : '-')),
      el('td', {class: 'num'}, w.rank === undefined ? '-' : w.rank),
      el('td', {}, age(num(w.last_heartbeat))))));
  });
}

// ---- Compare ----
function comparePage(ids) {
  const input = el('input', {id: 'compare-jobs', size: 60, placeholder: 'job ids, comma separated'});
  input.value = ids.join(',');
  const verdicts = el('div', {id: 'verdicts'});
  const curves = el('section', {id: 'compare-curves'});
  main.replaceChildren(el('p', {}, input, ' ', el('button', {id: 'compare-go', onclick: () => {
    location.hash = '#/compare/' + input.value.split(',').map((s) => s.trim()).filter(Boolean).join(',');
  }}, 'Compare')), verdicts, curves);
  if (ids.length < 2) { verdicts.textContent = 'pick two or more jobs'; return; }
  live(async () => {
    const result = await api('compare/' + ids.map(encodeURIComponent).join(','));
    verdicts.replaceChildren(
      ...(result.verdicts || []).map((v) => el('p', {class: v.same_function ? 'verdict same' : 'verdict differ'}, v.text)),
      ...(result.warnings || []).map((w) => el('p', {class: 'muted warning'}, w)));
    const jobs = await Promise.all(ids.map((id) => api('jobs/' + encodeURIComponent(id))));
    const bySamples = jobs.map((j) => ({name: j.status.job_id, points: j.curve.steps.map((x, i) =>
      [x * num(j.status.plan && j.status.plan.global_batch_size), j.curve.loss[i]])}));
    const byStep = jobs.map((j) => ({name: j.status.job_id, points: j.curve.steps.map((x, i) => [x, j.curve.loss[i]])}));
    const rows = [['workers', (j) => num(j.status.world_size)],
      ['global batch', (j) => num(j.status.plan && j.status.plan.global_batch_size)],
      ['per-worker batch', (j) => num(j.status.plan && j.status.plan.per_replica_batch_size)],
      ['learning rate', (j) => j.status.plan ? j.status.plan.scaled_lr + ' (' + (j.status.plan.lr_scaling || 'none') + ')' : '-'],
      ['warmup steps', (j) => num(j.status.plan && j.status.plan.warmup_steps)],
      ['precision', (j) => (j.status.spec && j.status.spec.precision) || 'fp32'],
      ['seed', (j) => num(j.status.spec && j.status.spec.seed)]];
    releaseDownloads();
    const stepChart = chart(byStep, 'step');
    const csv = ['job,step,samples_seen,loss'].concat(jobs.flatMap((j) => j.curve.steps.map((x, i) =>
      [j.status.job_id, x, x * num(j.status.plan && j.status.plan.global_batch_size), j.curve.loss[i]].join(',')))).join('\n') + '\n';
    curves.replaceChildren(
      el('p', {}, download('compare.csv', 'text/csv', csv, 'Download CSV'), ' ',
        download('compare.svg', 'image/svg+xml', new XMLSerializer().serializeToString(stepChart), 'Download SVG'), ' ',
        el('button', {id: 'download-png', onclick: () => savePng(stepChart, 'compare.png')}, 'Download PNG')),
      el('h3', {}, 'Loss by step'), stepChart,
      el('h3', {}, 'Loss by samples seen'), chart(bySamples, 'samples'),
      el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, ''), ...jobs.map((j) => el('th', {}, j.status.job_id)))),
        el('tbody', {}, ...rows.map(([name, get]) => el('tr', {}, el('td', {}, name), ...jobs.map((j) => el('td', {}, get(j))))))));
  });
}

function route() {
  const hash = location.hash || '#/jobs';
  for (const id of ['jobs', 'queue', 'workers', 'compare']) {
    document.getElementById('nav-' + id).className = hash.startsWith('#/' + id) ? 'current' : '';
  }
  if (hash.startsWith('#/job/')) return jobPage(decodeURIComponent(hash.slice(6)));
  if (hash.startsWith('#/queue')) return queuePage();
  if (hash.startsWith('#/workers')) return workersPage();
  if (hash.startsWith('#/compare')) return comparePage(hash.slice(10).split(',').filter(Boolean).map(decodeURIComponent));
  return jobsPage();
}
window.addEventListener('hashchange', route);
route();
)js";
}

}  // namespace lockstep::client
