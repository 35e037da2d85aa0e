// Offline check of podman-play.mjs (run by check.sh): translates one
// rendering of the cpu overlay with stand-in TLS Secrets and checks what
// scripts/e2e relies on, then a few rules on their own.
//
//   node deploy/podman_play_check.mjs RENDERED.yaml SECRET_DIR
//
// Prints "ok podman-play N pods" or one line per problem; exit 0 or 1.
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { expand, translate } from './podman-play.mjs';

const [renderedFile, filesDir] = process.argv.slice(2);
const problems = [];
const expect = (ok, message) => {
  if (!ok) problems.push(message);
};
const PREFIX = 'lockstep-e2e-';

const rendered = parseAllDocuments(readFileSync(renderedFile, 'utf8'))
  .map((d) => d.toJS()).filter(Boolean);
// Stand-ins for the Secrets of deploy/README.md "Certificates".
const secretNames = ['lockstep-coordinator-tls', 'lockstep-worker-0-tls', 'lockstep-worker-1-tls',
  'lockstep-spare-0-tls', 'lockstep-submit-tls'];
const secrets = secretNames.map((name) => ({
  apiVersion: 'v1', kind: 'Secret', type: 'kubernetes.io/tls', metadata: { name },
  data: Object.fromEntries(['tls.crt', 'tls.key', 'ca.crt']
    .map((k) => [k, Buffer.from(`${name}/${k}`).toString('base64')])),
}));

const out = translate([...rendered, ...secrets], { prefix: PREFIX, filesDir });
const pods = out.filter((o) => o.kind === 'Pod');
const podNames = pods.map((p) => p.metadata.name).sort();
const wanted = ['lockstep-coordinator-0', 'lockstep-spare-0', 'lockstep-submit',
  'lockstep-worker-0', 'lockstep-worker-1'].map((n) => PREFIX + n);
expect(JSON.stringify(podNames) === JSON.stringify(wanted), `pods ${podNames} instead of ${wanted}`);
const kinds = new Set(out.map((o) => o.kind));
expect([...kinds].every((k) => ['Pod', 'ConfigMap', 'PersistentVolumeClaim'].includes(k)),
  `kinds ${[...kinds]}: only Pod, ConfigMap and PersistentVolumeClaim are played`);
for (const o of out) {
  expect(o.metadata.name.startsWith(PREFIX), `${o.kind}/${o.metadata.name} lacks the prefix`);
  expect(!JSON.stringify(o).includes('$('), `${o.kind}/${o.metadata.name} still has a $(VAR)`);
  expect(!JSON.stringify(o).includes('valueFrom'), `${o.kind}/${o.metadata.name} still has a valueFrom`);
}
const claims = out.filter((o) => o.kind === 'PersistentVolumeClaim').map((o) => o.metadata.name).sort();
expect(JSON.stringify(claims) === JSON.stringify([`${PREFIX}lockstep-backup`, `${PREFIX}state-lockstep-coordinator-0`]),
  `PVCs ${claims}`);

const argAfter = (args, flag) => (args.includes(flag) ? args[args.indexOf(flag) + 1] : undefined);
const seenPorts = new Map();
for (const pod of pods) {
  const name = pod.metadata.name;
  expect(pod.spec.hostNetwork === true, `${name}: not on the host network`);
  const hostsFile = pod.spec.volumes.find((v) => v.name === 'podman-play-hosts')?.hostPath?.path;
  const hosts = hostsFile ? readFileSync(hostsFile, 'utf8') : '';
  for (const host of ['lockstep-coordinator', 'lockstep-worker-1.lockstep-workers']) {
    expect(new RegExp(`^127\\.0\\.0\\.1\\t${host.replace(/\./g, '\\.')}$`, 'm').test(hosts),
      `${name}: ${host} is not 127.0.0.1 in its hosts file ${hostsFile}`);
  }
  for (const v of pod.spec.volumes.filter((v) => v.emptyDir)) {
    expect(v.name.startsWith(name), `${name}: emptyDir ${v.name} is not named after its pod (podman would share it)`);
  }
  for (const c of pod.spec.containers) {
    expect(c.volumeMounts.some((m) => m.mountPath === '/etc/hosts' && m.name === 'podman-play-hosts'),
      `${name}: container ${c.name} does not mount the hosts file`);
    const args = c.args || [];
    const listen = argAfter(args, '--listen') ?? argAfter(args, '--health-listen');
    if (listen) {
      const port = Number(listen.split(':').pop());
      expect(!seenPorts.has(port), `${name}: port ${port} also used by ${seenPorts.get(port)}`);
      seenPorts.set(port, name);
      for (const probe of [c.livenessProbe, c.readinessProbe]) {
        expect(probe?.exec?.command?.at(-1) === `127.0.0.1:${port}`,
          `${name}: probe ${probe?.exec?.command} does not dial its daemon's port ${port}`);
      }
      const annotated = (pod.metadata.annotations['podman-play.lockstep/ports'] || '').split(',');
      expect(annotated.some((entry) => entry.endsWith(`=${port}`)),
        `${name}: ports annotation ${pod.metadata.annotations['podman-play.lockstep/ports']}`);
    }
    const metrics = argAfter(args, '--metrics-listen');
    if (metrics) {
      const port = Number(metrics.split(':').pop());
      expect(!seenPorts.has(port), `${name}: metrics port ${port} also used by ${seenPorts.get(port)}`);
      seenPorts.set(port, name);
      const scrape = pod.metadata.annotations['prometheus.io/port'];
      expect(scrape === undefined || scrape === String(port),
        `${name}: prometheus.io/port ${scrape} is not its --metrics-listen port ${port}`);
    }
    if (c.command?.[0] === 'lockstep-worker') {
      expect(argAfter(args, '--host') === '127.0.0.1', `${name}: --host ${argAfter(args, '--host')}`);
      const index = pod.metadata.labels['apps.kubernetes.io/pod-index'];
      if (args.includes('--task-index')) {
        expect(argAfter(args, '--task-index') === index, `${name}: --task-index ${argAfter(args, '--task-index')} on pod index ${index}`);
      }
      const cert = argAfter(args, '--tls-cert');
      const file = join(filesDir, name, 'tls', cert.replace('/etc/lockstep/tls/', ''));
      let mode = 0;
      try {
        mode = statSync(file).mode & 0o777;
      } catch {
        problems.push(`${name}: ${cert} is not written at ${file}`);
      }
      expect(mode === 0o440, `${name}: ${file} has mode ${mode.toString(8)}, not the volume's defaultMode 440`);
    }
  }
}
const submit = pods.find((p) => p.metadata.name === `${PREFIX}lockstep-submit`);
expect(submit?.spec.restartPolicy === 'Never', 'the submit Job\'s pod does not restart Never');
expect(submit?.metadata.annotations['podman-play.lockstep/fail-job-exit-codes'] === '1,2',
  'the submit pod does not carry the FailJob exit codes 1,2');

// Rules on their own.
expect(expand('a $(X) $$(X) $(Y) $(', { X: '1' }) === 'a 1 $(X) $(Y) $(', 'expand: Kubernetes rules for $$ and unknown names');
const only = translate([...rendered, ...secrets], { prefix: PREFIX, filesDir, only: new Set(['lockstep-submit']) });
expect(only.map((o) => o.kind).join() === 'ConfigMap,Pod', `--only lockstep-submit gives ${only.map((o) => o.kind)}`);
const skip = translate([...rendered, ...secrets], { prefix: PREFIX, filesDir, skip: new Set(['lockstep-submit']) });
expect(skip.filter((o) => o.kind === 'Pod').length === pods.length - 1 && skip.some((o) => o.kind === 'PersistentVolumeClaim') &&
  !skip.some((o) => o.metadata.name === `${PREFIX}lockstep-submit`), '--skip lockstep-submit: every other pod and the PVCs');
const moved = translate([
  { kind: 'Service', metadata: { name: 'b' }, spec: { selector: { app: 'b' }, ports: [{ port: 80, targetPort: 9000 }] } },
  ...['a', 'b'].map((app) => ({
    kind: 'Pod', metadata: { name: app, labels: { app } },
    spec: { containers: [{ name: 'c', args: ['--listen', ':9000', '--peer', 'b:80'], ports: [{ containerPort: 9000 }] }] },
  })),
], { filesDir: join(filesDir, 'rules') });
const [podA, podB] = moved.map((p) => p.spec.containers[0].args);
expect(podA.join(' ') === '--listen :9000 --peer b:9001' && podB.join(' ') === '--listen :9001 --peer b:9001',
  `a port taken by an earlier pod moves, with the Service's clients: ${podA} / ${podB}`);
for (const [object, rule] of [
  [{ kind: 'Deployment', metadata: { name: 'd' } }, 'kind Deployment'],
  [{ kind: 'Pod', metadata: { name: 'p' }, spec: { containers: [{ name: 'c', env: [{ name: 'X', valueFrom: { fieldRef: { fieldPath: 'status.podIPs' } } }] }] } }, 'fieldRef status.podIPs'],
]) {
  let message = '';
  try {
    translate([object], { filesDir: join(filesDir, 'rules') });
  } catch (error) {
    message = error.message;
  }
  expect(message.includes(rule), `what is not translated must fail, naming it: "${rule}" gave "${message}"`);
}

for (const p of problems) console.log(`podman-play: ${p}`);
if (problems.length) process.exit(1);
console.log(`ok podman-play ${pods.length} pods`);
