// lockstep's security rules for validate.mjs (issue 15): mutual TLS on
// every daemon and CLI, with certificates from Secrets; probes that can do
// TLS; NetworkPolicies that admit only the job's own pods.
//
// Rules (names as printed):
//   tls            a lockstep daemon has --tls-cert, --tls-key and --tls-ca
//                  (never --insecure), a CLI container has LOCKSTEP_TLS_CERT,
//                  _KEY and _CA (never LOCKSTEP_INSECURE=1), and each file
//                  comes from a Secret volume that provides it: for every pod
//                  index, when the path depends on the index (a projected
//                  volume of per-task Secrets), and readable by the
//                  container's non-root user (0440 needs fsGroup)
//   tls-probes     a daemon with TLS is probed by an exec probe running
//                  `lockstep health 127.0.0.1:PORT` on its own port, with
//                  LOCKSTEP_TLS_* set (the kubelet's grpc probe cannot do TLS)
//   network-policy every daemon's pods are selected by an Ingress
//                  NetworkPolicy whose sources are pod selectors within the
//                  namespace: the coordinator's port admits exactly the
//                  workers, spares and submit pods; the workers admit exactly
//                  the workers and spares, on every port (Gloo's ports are
//                  ephemeral)

const TLS_FLAGS = ['--tls-cert', '--tls-key', '--tls-ca'];
const TLS_ENV = ['LOCKSTEP_TLS_CERT', 'LOCKSTEP_TLS_KEY', 'LOCKSTEP_TLS_CA'];
// Downward-API fields that carry a pod's index within its workload.
const INDEX_FIELDS = [
  "metadata.labels['apps.kubernetes.io/pod-index']",
  "metadata.annotations['batch.kubernetes.io/job-completion-index']",
  "metadata.labels['batch.kubernetes.io/job-completion-index']",
  "metadata.labels['training.kubeflow.org/replica-index']",
];
const SECRET_TLS_KEYS = ['tls.crt', 'tls.key', 'ca.crt'];

// How many pods share a template (pod index 0 .. n-1).
function podsOf(obj, where) {
  const spec = obj.spec || {};
  if (obj.kind === 'StatefulSet') return spec.replicas ?? 1;
  if (obj.kind === 'Job' && spec.completionMode === 'Indexed') return spec.completions ?? 1;
  if (obj.kind === 'TFJob') {
    const type = where.split('.')[1];
    return spec.tfReplicaSpecs?.[type]?.replicas ?? 1;
  }
  return 1;
}

// The value of $(NAME) references in `text` for pod index `index`, with the
// container's env (a variable from the downward API's index is the index;
// any other valueFrom stays unresolved). Kubernetes expands a reference
// only to a variable defined earlier in the list, and so does this.
function expand(text, env, index, upTo = env.length) {
  return String(text).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name) => {
    const at = env.slice(0, upTo).findLastIndex((e) => e.name === name);
    if (at < 0) return whole;
    const e = env[at];
    if (e.value !== undefined) return expand(e.value, env, index, at);
    if (INDEX_FIELDS.includes(e.valueFrom?.fieldRef?.fieldPath)) return String(index);
    if (name === 'JOB_COMPLETION_INDEX') return String(index);
    return whole;
  });
}

const envValue = (c, name) => (c.env || []).find((e) => e.name === name);

// The files a volume provides, relative to its mount: {path: mode} or
// undefined when it is not a Secret (or a projection of Secrets).
function secretFiles(volume) {
  const files = {};
  const add = (source, defaultMode) => {
    const items = source.items;
    if (!items) {
      for (const key of SECRET_TLS_KEYS) files[key] = defaultMode;
    } else {
      for (const item of items) files[item.path] = item.mode ?? defaultMode;
    }
  };
  if (volume.secret) {
    add(volume.secret, volume.secret.defaultMode ?? 0o644);
    return files;
  }
  if (volume.projected) {
    const mode = volume.projected.defaultMode ?? 0o644;
    const sources = volume.projected.sources || [];
    if (sources.length === 0 || !sources.every((s) => s.secret)) return undefined;
    for (const s of sources) add(s.secret, mode);
    return files;
  }
  return undefined;
}

// Problems with `path` (already expanded) for one container, or [].
function fileProblems(path, c, pod, volumes) {
  if (path.includes('$(')) return [`${path} names a variable that cannot be resolved here`];
  const mount = (c.volumeMounts || [])
    .filter((m) => path.startsWith(m.mountPath.replace(/\/?$/, '/')))
    .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  if (!mount) return [`${path} is on no mounted volume`];
  const files = secretFiles(volumes[mount.name] || {});
  if (!files) return [`${path} is on volume ${mount.name}, which is not a Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt)`];
  const relative = path.slice(mount.mountPath.replace(/\/?$/, '/').length);
  if (!(relative in files)) return [`${path}: volume ${mount.name} provides no ${relative} (it has ${Object.keys(files).join(', ')})`];
  const mode = files[relative];
  const uid = c.securityContext?.runAsUser ?? pod.securityContext?.runAsUser;
  const readable = (mode & 0o004) !== 0 || ((mode & 0o040) !== 0 && pod.securityContext?.fsGroup !== undefined) || uid === 0;
  if (!readable) return [`${path} (mode ${mode.toString(8)}) is unreadable by the container's user: set the pod's fsGroup`];
  return [];
}

function checkTlsFiles(h, { obj, where, template }, report) {
  const pod = template.spec || {};
  const volumes = Object.fromEntries((pod.volumes || []).map((v) => [v.name, v]));
  const pods = podsOf(obj, where);
  for (const c of h.containersOf(pod)) {
    const daemon = h.isWorker(c) || h.isCoordinator(c);
    const cli = !daemon && h.runs(c, 'lockstep');
    if (!daemon && !cli) continue;
    const at = `${where ? where + ': ' : ''}container ${c.name}`;
    const env = c.env || [];
    const paths = [];
    if (daemon) {
      if (h.commandLine(c).includes('--insecure')) report(obj, 'tls', `${at}: --insecure turns mutual TLS off; give --tls-cert, --tls-key and --tls-ca`);
      for (const name of TLS_FLAGS) {
        const value = h.flag(c, name);
        if (value === undefined) report(obj, 'tls', `${at}: ${name} is missing (mutual TLS on every daemon)`);
        else paths.push([name, value]);
      }
    } else {
      if (envValue(c, 'LOCKSTEP_INSECURE')?.value === '1') report(obj, 'tls', `${at}: LOCKSTEP_INSECURE=1 turns mutual TLS off`);
      for (const name of TLS_ENV) {
        const e = envValue(c, name);
        if (e?.value === undefined) report(obj, 'tls', `${at}: the CLI needs ${name} (a file of the operator's Secret)`);
        else paths.push([name, `$(${name})`]);
      }
    }
    for (const [name, value] of paths) {
      const seen = new Set();
      for (let index = 0; index < pods; index++) {
        for (const problem of fileProblems(expand(value, env, index), c, pod, volumes)) {
          if (seen.has(problem)) continue;
          seen.add(problem);
          report(obj, 'tls', `${at}: ${name}${pods > 1 ? ` (pod ${index})` : ''}: ${problem}`);
        }
      }
    }
  }
}

// The port a daemon serves gRPC on: --listen (coordinator) or --health-listen.
function daemonPort(h, c) {
  const listen = h.flag(c, h.isCoordinator(c) ? '--listen' : '--health-listen');
  const port = listen === undefined ? undefined : Number(String(listen).split(':').pop());
  return Number.isInteger(port) ? port : undefined;
}

function checkProbes(h, { obj, where, template }, report) {
  for (const c of h.containersOf(template.spec)) {
    if (!(h.isWorker(c) || h.isCoordinator(c)) || h.commandLine(c).includes('--insecure')) continue;
    const at = `${where ? where + ': ' : ''}container ${c.name}`;
    const port = daemonPort(h, c);
    for (const kind of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
      const probe = c[kind];
      if (!probe) continue;
      if (probe.grpc || probe.httpGet || probe.tcpSocket) {
        report(obj, 'tls-probes', `${at}: ${kind} is not an exec probe; the kubelet's probes cannot do mutual TLS: use exec ["lockstep", "health", "127.0.0.1:${port ?? 'PORT'}"]`);
        continue;
      }
      const command = probe.exec?.command || [];
      const ok = String(command[0]).split('/').pop() === 'lockstep' && command[1] === 'health' &&
        (port === undefined || /^(127\.0\.0\.1|localhost):(\d+)$/.test(command[2] ?? '') && Number(command[2].split(':')[1]) === port);
      if (!ok) report(obj, 'tls-probes', `${at}: ${kind} runs ${JSON.stringify(command)}; it must run ["lockstep", "health", "127.0.0.1:${port ?? 'PORT'}"], the daemon's own port`);
    }
    const missing = TLS_ENV.filter((name) => envValue(c, name)?.value === undefined);
    if (missing.length > 0 && (c.readinessProbe?.exec || c.livenessProbe?.exec)) {
      report(obj, 'tls-probes', `${at}: the probe's lockstep health needs ${missing.join(', ')} in the container's env`);
    }
  }
}

// The templates a NetworkPolicy peer admits, or a reason it admits more.
function peerTemplates(h, peer, templates) {
  if (peer.ipBlock) return { why: `ipBlock ${peer.ipBlock.cidr} admits addresses, not the job's pods` };
  if (peer.namespaceSelector) return { why: 'a namespaceSelector admits pods of other namespaces' };
  const selector = peer.podSelector || {};
  if (Object.keys(selector.matchLabels || {}).length === 0 && (selector.matchExpressions || []).length === 0) {
    return { why: 'an empty podSelector admits every pod of the namespace' };
  }
  return { matched: templates.filter((t) => h.selectorMatches(selector, t.template.metadata?.labels)) };
}

const admitsPort = (rule, port) => !rule.ports || rule.ports.length === 0 ||
  rule.ports.some((p) => p.port === undefined || p.port === port || p.port === 'grpc' ||
    (typeof p.port === 'number' && p.endPort !== undefined && p.port <= port && port <= p.endPort));

// The scrape rule: only the metrics port (9464, the daemons' plain-HTTP
// /metrics), only from Prometheus' pods (any namespace). It admits nobody to
// the coordinator's gRPC port or the workers' Gloo and health ports, so the
// checks below skip it.
const METRICS_PORT = 9464;
const isMetricsRule = (rule) => (rule.ports || []).length > 0 &&
  rule.ports.every((p) => (p.port === METRICS_PORT || p.port === 'metrics') && p.endPort === undefined) &&
  (rule.from || []).length > 0 &&
  rule.from.every((peer) => !peer.ipBlock &&
    peer.podSelector?.matchLabels?.['app.kubernetes.io/name'] === 'prometheus');

function checkNetworkPolicies(h, objects, templates, report) {
  const policies = objects.filter((o) => o.kind === 'NetworkPolicy' &&
    (!o.spec?.policyTypes || o.spec.policyTypes.includes('Ingress')));
  const daemonIn = (t, test) => h.containersOf(t.template.spec).some(test);
  const workers = templates.filter((t) => daemonIn(t, h.isWorker));
  const clis = templates.filter((t) => !daemonIn(t, h.isWorker) && !daemonIn(t, h.isCoordinator) &&
    daemonIn(t, (c) => h.runs(c, 'lockstep')));
  const name = (t) => `${t.obj.kind}/${t.obj.metadata?.name}`;
  for (const t of templates) {
    const coordinator = h.containersOf(t.template.spec).find(h.isCoordinator);
    if (!coordinator && !daemonIn(t, h.isWorker)) continue;
    const port = coordinator ? daemonPort(h, coordinator) : undefined;
    const selecting = policies.filter((p) => h.selectorMatches(p.spec?.podSelector, t.template.metadata?.labels));
    const what = coordinator ? `the coordinator's port ${port ?? ''}`.trim() : "the workers' ports";
    if (selecting.length === 0) {
      report(t.obj, 'network-policy', `no Ingress NetworkPolicy selects these pods: anyone on the cluster network reaches ${what}`);
      continue;
    }
    const expected = coordinator ? [...workers, ...clis] : workers;
    const admitted = new Set();
    for (const p of selecting) {
      for (const rule of p.spec.ingress || []) {
        if (isMetricsRule(rule)) continue;
        if (!rule.from || rule.from.length === 0) {
          report(p, 'network-policy', `an ingress rule without "from" admits everyone to ${what}`);
          continue;
        }
        for (const peer of rule.from) {
          const { why, matched } = peerTemplates(h, peer, templates);
          if (why) { report(p, 'network-policy', `${why} to ${what}`); continue; }
          for (const m of matched) {
            if (!expected.includes(m)) report(p, 'network-policy', `admits ${name(m)} to ${what}; only the job's ${coordinator ? 'workers and submit pods' : 'workers'} belong there`);
            else if (coordinator ? admitsPort(rule, port) : !rule.ports || rule.ports.length === 0) admitted.add(m);
          }
        }
      }
    }
    for (const m of expected.filter((e) => !admitted.has(e))) {
      report(t.obj, 'network-policy', coordinator
        ? `${name(m)} cannot reach the coordinator's port ${port}: no NetworkPolicy admits it`
        : `${name(m)} is not admitted to every port of the workers (Gloo listens on ephemeral ports: a rule without "ports")`);
    }
  }
}

// Problems of one rendering; `h` holds validate.mjs's helpers.
export function securityProblems(h, objects, templates, report) {
  for (const t of templates) {
    checkTlsFiles(h, t, report);
    checkProbes(h, t, report);
  }
  checkNetworkPolicies(h, objects, templates, report);
}
