// Translates rendered Kubernetes manifests (kubectl kustomize output, plus
// the TLS Secrets) into YAML that `podman kube play` (podman 4.3, Debian 12)
// runs on one machine, on the host network. scripts/e2e uses it to run the
// `cpu` overlay as containers.
//
//   kubectl kustomize deploy/k8s/overlays/cpu | cat - secrets.yaml |
//     node deploy/podman-play.mjs --prefix lockstep-e2e- --files-dir DIR >play.yaml
//
// Options:
//   --prefix P       prepended to every pod, volume (PVC) and ConfigMap name,
//                    so that everything played can be found and removed by it;
//                    the names the containers use (Services, pod DNS names)
//                    stay as they are
//   --files-dir D    where each pod's /etc/hosts and its Secret and projected
//                    volumes are written as files (D/POD/...)
//   --only N[,N]     only the pods of these workloads (StatefulSet, Job or Pod
//                    names) and the ConfigMaps they mount: to play one again
//                    beside the others (no PVCs; they exist already)
//   --skip N[,N]     every pod but these workloads' (with every PVC): to play
//                    a Job later, once the daemons are ready
//   --namespace NS   the namespace in DNS names and metadata.namespace
//                    (default: default)
//
// podman kube play 4.3 runs Pods, Deployments, PersistentVolumeClaims,
// ConfigMaps and Secrets; it silently skips every other kind, does not expand
// $(VAR), has no projected volumes, and runs every pod here in the host's
// network namespace (containers.conf netns = "host"). What is translated,
// and why (deploy/README.md "Running the manifests with podman" says the same):
//
//   StatefulSet     one Pod per replica, NAME-0 .. NAME-(n-1), with the labels
//                   a StatefulSet controller adds (apps.kubernetes.io/pod-index,
//                   statefulset.kubernetes.io/pod-name) and restartPolicy
//                   Always; each volumeClaimTemplate becomes a PVC
//                   CLAIM-NAME-i, as Kubernetes names it.
//   Job             one Pod named like the Job, its template's restartPolicy,
//                   labels job-name and batch.kubernetes.io/job-name. podman
//                   has no Job controller: the annotations
//                   podman-play.lockstep/backoff-limit and .../fail-job-exit-codes
//                   (podFailurePolicy FailJob exit codes) tell the caller
//                   (scripts/e2e) when to run it again. Only parallelism and
//                   completions 1, not Indexed.
//   Service         no object: every Service name (NAME, NAME.NS, NAME.NS.svc,
//                   NAME.NS.svc.cluster.local) and every pod name under a
//                   StatefulSet's serviceName (POD.SERVICE, ...) is 127.0.0.1
//                   in a hosts file mounted at /etc/hosts in every container
//                   (not hostAliases: on the host network podman 4.3 writes
//                   them only into the pod's infra container's /etc/hosts).
//   NetworkPolicy   dropped: nothing enforces one on the host network.
//   Secret          no object (podman would keep it as a podman secret, and
//                   4.3 mounts only a secret's data keys, without items,
//                   modes or projected volumes): every secret and projected
//                   volume becomes a hostPath folder under --files-dir with
//                   the volume's items, paths and modes, owned by root and the
//                   pod's fsGroup, as the kubelet writes it.
//   configMap vol.  kept (4.3 supports it); the ConfigMap is renamed with the
//                   prefix, since podman keeps its files in a volume named so.
//   PVC             kept, renamed with the prefix; the annotations
//                   volume.podman.io/uid and /gid are set to the runAsUser and
//                   fsGroup of the pods that mount it (podman ignores fsGroup,
//                   and a new volume is owned by root).
//   emptyDir        renamed POD-VOLUME with the prefix: podman 4.3 names the
//                   anonymous volume after the pod's volume name, so every
//                   pod's `tmp` would be one shared volume; sizeLimit and
//                   medium are not enforced.
//   fsGroup         also added to supplementalGroups (podman ignores fsGroup;
//                   Kubernetes adds it to every container's groups).
//   env valueFrom   resolved to literal values: fieldRef metadata.name,
//                   metadata.namespace, metadata.uid, metadata.labels['...'],
//                   metadata.annotations['...'], spec.nodeName,
//                   spec.serviceAccountName, status.podIP and status.hostIP
//                   (127.0.0.1: the host network, reached on loopback only),
//                   resourceFieldRef (rounded up, as the kubelet does),
//                   configMapKeyRef and secretKeyRef; envFrom likewise.
//   $(VAR)          expanded in env values (earlier variables only), command
//                   and args, with Kubernetes' rules: $$ is a literal $, an
//                   unknown $(NAME) stays as written.
//   ports           every pod shares the host's ports, so a containerPort that
//                   an earlier pod (in input order) already holds moves to the
//                   next port free of every pod's own; the move is applied to
//                   HOST:PORT strings in command, args, env values and exec
//                   probes (HOST empty, 0.0.0.0, 127.0.0.1, localhost, [::],
//                   [::1], or a name of that pod or of a Service that selects
//                   only it), to probe port numbers, and to SERVICE:PORT where
//                   a Service's port differs from its pod's host port. A port
//                   written alone (--port 8081) is not recognised. The
//                   containers' ports lists are dropped (podman would publish
//                   them, which the host network does not allow); the
//                   annotation podman-play.lockstep/ports lists the result,
//                   and a prometheus.io/port annotation follows its port.
//   hostNetwork     set on every pod.
//
// Left as written, with podman's own meaning: resources (CPU quota, memory
// limit), securityContext (user, group, read-only root, capabilities),
// livenessProbe (a podman healthcheck that restarts the
// container; it runs on a systemd timer, so without systemd only when
// `podman healthcheck run` is called), readinessProbe (ignored by podman;
// scripts/e2e runs it with `podman exec`). Any other kind, volume type or
// valueFrom is an error, not skipped.
//
// Exit 0, or 1 with a message naming the object.
import { chownSync, chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join, normalize } from 'node:path';
import { parseAllDocuments, stringify } from 'yaml';

const LOOPBACK = '127.0.0.1';
const ANNOTATION = 'podman-play.lockstep';
const HOSTS_VOLUME = 'podman-play-hosts';

class TranslateError extends Error {}
const fail = (where, message) => {
  throw new TranslateError(`${where}: ${message}`);
};

// ---- options -----------------------------------------------------------------
function parseOptions(argv) {
  const options = { prefix: '', filesDir: '', only: null, skip: null, namespace: 'default' };
  const names = {
    '--prefix': 'prefix', '--files-dir': 'filesDir', '--only': 'only', '--skip': 'skip', '--namespace': 'namespace',
  };
  for (let i = 0; i < argv.length; i++) {
    let [flag, value] = argv[i].split(/=(.*)/s);
    if (argv[i] === '--help' || argv[i] === '-h') {
      process.stdout.write(readFileSync(new URL(import.meta.url), 'utf8').split('\nimport ')[0]
        .split('\n').map((l) => l.replace(/^\/\/ ?/, '')).join('\n') + '\n');
      process.exit(0);
    }
    if (!(flag in names)) fail('usage', `unknown option ${argv[i]} (--help)`);
    if (value === undefined) value = argv[++i];
    if (value === undefined) fail('usage', `${flag} needs a value`);
    options[names[flag]] = value;
  }
  for (const key of ['only', 'skip']) {
    if (options[key] !== null) options[key] = new Set(options[key].split(',').filter(Boolean));
  }
  return options;
}

// ---- quantities (resourceFieldRef) -------------------------------------------
const SUFFIX = {
  n: 1e-9, u: 1e-6, m: 1e-3, '': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
};
function quantity(text, where) {
  const match = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(text).trim());
  if (!match || !(match[2] in SUFFIX)) fail(where, `cannot read the quantity "${text}"`);
  return Number(match[1]) * SUFFIX[match[2]];
}

// ---- $(VAR) expansion, Kubernetes' rules (third_party/forked/golang/expansion)
export function expand(text, vars) {
  let out = '';
  for (let i = 0; i < text.length; i++) {
    if (text[i] !== '$' || i + 1 >= text.length) {
      out += text[i];
      continue;
    }
    if (text[i + 1] === '$') {
      out += '$';
      i++;
    } else if (text[i + 1] === '(') {
      const end = text.indexOf(')', i + 2);
      if (end < 0) {
        out += text.slice(i);
        break;
      }
      const name = text.slice(i + 2, end);
      out += Object.hasOwn(vars, name) ? vars[name] : text.slice(i, end + 1);
      i = end;
    } else {
      out += text[i];
    }
  }
  return out;
}

// ---- workloads to pods ---------------------------------------------------------
const clone = (value) => structuredClone(value);

// A pod to be played: its Kubernetes name, where it came from, and its spec.
function podFrom(kind, owner, name, template, extraLabels) {
  const metadata = clone(template.metadata || {});
  metadata.name = name;
  metadata.labels = { ...(metadata.labels || {}), ...extraLabels };
  metadata.annotations = { ...(metadata.annotations || {}), [`${ANNOTATION}/from`]: `${kind}/${owner}` };
  return { name, owner, kind, metadata, spec: clone(template.spec || {}), claims: [] };
}

function statefulSetPods(set) {
  const name = set.metadata.name;
  const where = `StatefulSet/${name}`;
  const replicas = set.spec.replicas ?? 1;
  const pods = [];
  for (let i = 0; i < replicas; i++) {
    const podName = `${name}-${i}`;
    const pod = podFrom('StatefulSet', name, podName, set.spec.template, {
      'apps.kubernetes.io/pod-index': String(i),
      'statefulset.kubernetes.io/pod-name': podName,
    });
    const policy = pod.spec.restartPolicy ?? 'Always';
    if (policy !== 'Always') fail(where, `restartPolicy ${policy}: a StatefulSet's pods restart Always`);
    pod.spec.restartPolicy = 'Always';
    pod.serviceName = set.spec.serviceName;
    pod.spec.volumes = pod.spec.volumes || [];
    for (const claim of set.spec.volumeClaimTemplates || []) {
      const claimName = `${claim.metadata.name}-${podName}`;
      pod.claims.push({
        apiVersion: 'v1', kind: 'PersistentVolumeClaim', ...clone(claim),
        metadata: { ...clone(claim.metadata), name: claimName },
      });
      pod.spec.volumes.push({ name: claim.metadata.name, persistentVolumeClaim: { claimName } });
    }
    pods.push(pod);
  }
  return pods;
}

function jobPod(job) {
  const name = job.metadata.name;
  const where = `Job/${name}`;
  const spec = job.spec || {};
  if ((spec.parallelism ?? 1) !== 1 || (spec.completions ?? 1) !== 1) {
    fail(where, 'only parallelism 1 and completions 1 are translated (one pod)');
  }
  if (spec.completionMode === 'Indexed') fail(where, 'Indexed Jobs are not translated');
  const pod = podFrom('Job', name, name, spec.template, {
    'job-name': name,
    'batch.kubernetes.io/job-name': name,
  });
  const policy = pod.spec.restartPolicy;
  if (policy !== 'Never' && policy !== 'OnFailure') fail(where, `restartPolicy ${policy}: a Job's pods need Never or OnFailure`);
  const failCodes = [];
  for (const rule of spec.podFailurePolicy?.rules || []) {
    if (rule.action !== 'FailJob' || !rule.onExitCodes) continue;
    if (rule.onExitCodes.operator !== 'In') fail(where, 'podFailurePolicy: only FailJob on exit codes In [...] is translated');
    failCodes.push(...rule.onExitCodes.values);
  }
  pod.metadata.annotations[`${ANNOTATION}/backoff-limit`] = String(spec.backoffLimit ?? 6);
  pod.metadata.annotations[`${ANNOTATION}/fail-job-exit-codes`] = failCodes.join(',');
  return pod;
}

function plainPod(object) {
  return podFrom('Pod', object.metadata.name, object.metadata.name,
    { metadata: object.metadata, spec: object.spec }, {});
}

// ---- Services: names to 127.0.0.1, ports to the pods' host ports ---------------
const selects = (selector, labels) =>
  !!selector && Object.keys(selector).length > 0 &&
  Object.entries(selector).every(([k, v]) => labels[k] === v);

function dnsNames(name, namespace) {
  return [name, `${name}.${namespace}`, `${name}.${namespace}.svc`, `${name}.${namespace}.svc.cluster.local`];
}

// ---- ports ---------------------------------------------------------------------
// Moves each pod's containerPorts off the ports earlier pods hold. Returns
// pod name -> Map(original -> host port), and records named ports.
function assignPorts(pods) {
  const own = new Set();
  for (const pod of pods) {
    for (const c of pod.spec.containers || []) for (const p of c.ports || []) own.add(p.containerPort);
  }
  const taken = new Set();
  for (const pod of pods) {
    pod.portMap = new Map();
    pod.namedPorts = new Map();
    for (const c of pod.spec.containers || []) {
      for (const p of c.ports || []) {
        if ((p.protocol || 'TCP') !== 'TCP') fail(`pod ${pod.name}`, `port ${p.containerPort}/${p.protocol}: only TCP is translated`);
        let port = p.containerPort;
        if (taken.has(port)) {
          do port++; while (taken.has(port) || own.has(port));
          if (port > 65535) fail(`pod ${pod.name}`, 'no free port');
        }
        taken.add(port);
        if (port !== p.containerPort) pod.portMap.set(p.containerPort, port);
        if (p.name) pod.namedPorts.set(p.name, port);
        pod.namedPorts.set(String(p.containerPort), port);
      }
    }
  }
}

const escapeRegExp = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

// A function that rewrites HOST:PORT in one string: for each host (a list of
// names) the ports to move.
function addressRewriter(rules) {
  // rules: [{hosts: [...], allowBare: bool, map: Map(port -> port)}]
  const live = rules.filter((r) => r.map.size > 0);
  if (live.length === 0) return (s) => s;
  const compiled = live.map((rule) => {
    const hosts = rule.hosts.map(escapeRegExp).join('|');
    const ports = [...rule.map.keys()].join('|');
    const host = rule.allowBare ? `(?:${hosts})?` : `(?:${hosts})`;
    return {
      regex: new RegExp(`(^|[\\s=,"'/@(\\[{])(${host}):(${ports})(?![0-9])`, 'g'),
      map: rule.map,
    };
  });
  return (text) => {
    // One pass per rule over the original positions: replacements are marked
    // and applied together, so 8081->8082 and 8082->8083 never chain.
    const edits = [];
    for (const { regex, map } of compiled) {
      for (const m of text.matchAll(regex)) {
        const start = m.index + m[1].length + m[2].length + 1;
        edits.push({ start, end: start + m[3].length, port: map.get(Number(m[3])) });
      }
    }
    edits.sort((a, b) => b.start - a.start);
    let out = text;
    let last = Infinity;
    for (const e of edits) {
      if (e.end > last) continue;
      out = out.slice(0, e.start) + e.port + out.slice(e.end);
      last = e.start;
    }
    return out;
  };
}

// ---- env -----------------------------------------------------------------------
function resolveEnv(pod, container, ctx) {
  const where = `pod ${pod.name} container ${container.name}`;
  const vars = {};
  const env = [];
  const set = (name, value) => {
    vars[name] = value;
    const i = env.findIndex((e) => e.name === name);
    if (i >= 0) env.splice(i, 1);
    env.push({ name, value });
  };
  for (const from of container.envFrom || []) {
    const prefix = from.prefix || '';
    const source = from.configMapRef ? ctx.configMaps.get(from.configMapRef.name)?.data
      : from.secretRef ? ctx.secrets.get(from.secretRef.name) : undefined;
    if (!source) {
      const ref = from.configMapRef || from.secretRef;
      if (ref?.optional) continue;
      fail(where, `envFrom ${ref?.name ?? '?'} not found`);
    }
    for (const [k, v] of Object.entries(source)) set(prefix + k, Buffer.isBuffer(v) ? v.toString('utf8') : v);
  }
  for (const e of container.env || []) {
    if (e.valueFrom) {
      const value = valueFrom(e, pod, container, ctx, `${where} env ${e.name}`);
      if (value !== undefined) set(e.name, value);
    } else {
      set(e.name, expand(String(e.value ?? ''), vars));
    }
  }
  return { env, vars };
}

function valueFrom(e, pod, container, ctx, where) {
  const from = e.valueFrom;
  if (from.fieldRef) {
    const path = from.fieldRef.fieldPath;
    const label = /^metadata\.labels\['(.+)'\]$/.exec(path);
    const annotation = /^metadata\.annotations\['(.+)'\]$/.exec(path);
    if (label) return pod.metadata.labels[label[1]] ?? '';
    if (annotation) return pod.metadata.annotations[annotation[1]] ?? '';
    switch (path) {
      case 'metadata.name': return pod.name;
      case 'metadata.namespace': return ctx.namespace;
      case 'metadata.uid': return `${ctx.prefix}${pod.name}`;
      case 'spec.nodeName': return 'localhost';
      case 'spec.serviceAccountName': return pod.spec.serviceAccountName || 'default';
      case 'status.podIP': case 'status.hostIP': return LOOPBACK;
      default: fail(where, `fieldRef ${path} is not translated`);
    }
  }
  if (from.resourceFieldRef) {
    const ref = from.resourceFieldRef;
    const target = ref.containerName
      ? pod.spec.containers.find((c) => c.name === ref.containerName) : container;
    if (!target) fail(where, `resourceFieldRef names no container ${ref.containerName}`);
    const [kind, resource] = ref.resource.split('.');
    let value = target.resources?.[kind]?.[resource];
    if (value === undefined) {
      // Kubernetes: an unset limit is the node's allocatable.
      value = resource === 'cpu' ? String(cpus().length) : fail(where, `${ref.resource} is not set`);
    }
    const divisor = quantity(ref.divisor ?? '1', where);
    return String(Math.ceil(quantity(value, where) / divisor - 1e-9));
  }
  if (from.configMapKeyRef) {
    const ref = from.configMapKeyRef;
    const value = ctx.configMaps.get(ref.name)?.data?.[ref.key];
    if (value === undefined && !ref.optional) fail(where, `configMapKeyRef ${ref.name}/${ref.key} not found`);
    return value;
  }
  if (from.secretKeyRef) {
    const ref = from.secretKeyRef;
    const value = ctx.secrets.get(ref.name)?.[ref.key];
    if (value === undefined && !ref.optional) fail(where, `secretKeyRef ${ref.name}/${ref.key} not found`);
    return value === undefined ? undefined : value.toString('utf8');
  }
  fail(where, 'this valueFrom is not translated');
}

// ---- volumes -------------------------------------------------------------------
// Writes a secret or projected volume's files as the kubelet would: items (or
// every key) at their paths, with their modes, owned by root and fsGroup.
function materialize(pod, volume, ctx) {
  const where = `pod ${pod.name} volume ${volume.name}`;
  const root = join(podDir(pod, ctx), volume.name);
  const gid = pod.spec.securityContext?.fsGroup;
  const sources = volume.secret ? [{ secret: { ...volume.secret, name: volume.secret.secretName } }]
    : volume.projected.sources;
  const defaultMode = (volume.secret || volume.projected).defaultMode ?? 0o644;
  mkdirSync(root, { recursive: true, mode: 0o755 });
  for (const source of sources) {
    let data;
    let ref;
    if (source.secret) {
      ref = source.secret;
      data = ctx.secrets.get(ref.name);
    } else if (source.configMap) {
      ref = source.configMap;
      const cm = ctx.configMaps.get(ref.name);
      data = cm && Object.fromEntries(Object.entries(cm.data || {}).map(([k, v]) => [k, Buffer.from(v)]));
    } else {
      fail(where, `projected source ${Object.keys(source)[0]} is not translated`);
    }
    if (!data) {
      if (ref.optional) continue;
      fail(where, `${source.secret ? 'Secret' : 'ConfigMap'} ${ref.name} is not in the input`);
    }
    const items = ref.items || Object.keys(data).map((key) => ({ key, path: key }));
    for (const item of items) {
      if (!(item.key in data)) {
        if (ref.optional) continue;
        fail(where, `${ref.name} has no key ${item.key}`);
      }
      const path = normalize(item.path);
      if (path.startsWith('..') || path.startsWith('/')) fail(where, `item path ${item.path} leaves the volume`);
      const file = join(root, path);
      mkdirSync(dirname(file), { recursive: true, mode: 0o755 });
      writeFileSync(file, data[item.key]);
      chmodSync(file, item.mode ?? defaultMode);
      ownBy(file, 0, gid);
    }
  }
  return { name: volume.name, hostPath: { path: root, type: 'Directory' } };
}

function podDir(pod, ctx) {
  if (!ctx.filesDir) fail(`pod ${pod.name}`, 'needs --files-dir (its /etc/hosts, Secrets)');
  return join(ctx.filesDir, `${ctx.prefix}${pod.name}`);
}

// The pod's /etc/hosts: localhost, the pod's own host name, the Service and
// pod DNS names as 127.0.0.1, and the pod's own hostAliases.
function hostsVolume(pod, ctx) {
  const dir = podDir(pod, ctx);
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  const file = join(dir, 'hosts');
  const lines = ['127.0.0.1\tlocalhost', '::1\tlocalhost ip6-localhost ip6-loopback',
    `${LOOPBACK}\t${ctx.prefix}${pod.name}`, ...ctx.hostnames.map((h) => `${LOOPBACK}\t${h}`),
    ...(pod.spec.hostAliases || []).map((a) => `${a.ip}\t${a.hostnames.join(' ')}`)];
  delete pod.spec.hostAliases;
  writeFileSync(file, `# ${ctx.prefix}${pod.name}: written by deploy/podman-play.mjs\n${lines.join('\n')}\n`);
  chmodSync(file, 0o644);
  return { name: HOSTS_VOLUME, hostPath: { path: file, type: 'File' } };
}

function ownBy(file, uid, gid) {
  if (gid === undefined) return;
  try {
    chownSync(file, uid, gid);
  } catch (error) {
    if (error.code !== 'EPERM') throw error;  // not root: the offline check
  }
}

function translateVolumes(pod, ctx) {
  const out = [];
  for (const volume of pod.spec.volumes || []) {
    const where = `pod ${pod.name} volume ${volume.name}`;
    if (volume.secret || volume.projected) {
      out.push(materialize(pod, volume, ctx));
    } else if (volume.configMap) {
      if (!ctx.configMaps.has(volume.configMap.name) && !volume.configMap.optional) {
        fail(where, `ConfigMap ${volume.configMap.name} is not in the input`);
      }
      ctx.usedConfigMaps.add(volume.configMap.name);
      out.push({ ...volume, configMap: { ...volume.configMap, name: ctx.prefix + volume.configMap.name } });
    } else if (volume.persistentVolumeClaim) {
      const claim = volume.persistentVolumeClaim.claimName;
      ctx.claimUsers.set(claim, [...(ctx.claimUsers.get(claim) || []), pod]);
      out.push({ ...volume, persistentVolumeClaim: { ...volume.persistentVolumeClaim, claimName: ctx.prefix + claim } });
    } else if (volume.emptyDir) {
      const name = `${ctx.prefix}${pod.name}-${volume.name}`;
      for (const c of [...(pod.spec.initContainers || []), ...(pod.spec.containers || [])]) {
        for (const mount of c.volumeMounts || []) if (mount.name === volume.name) mount.name = name;
      }
      out.push({ ...volume, name });
    } else if (volume.hostPath) {
      out.push(volume);
    } else {
      fail(where, `${Object.keys(volume).filter((k) => k !== 'name')[0]} volumes are not translated`);
    }
  }
  pod.spec.volumes = out;
}

// ---- one pod -------------------------------------------------------------------
function rewriteStrings(list, fn) {
  return Array.isArray(list) ? list.map((s) => fn(String(s))) : list;
}

function translateContainer(pod, container, ctx, rewrite) {
  const { env, vars } = resolveEnv(pod, container, ctx);
  container.env = env.map((e) => ({ name: e.name, value: rewrite(e.value) }));
  delete container.envFrom;
  const full = (s) => rewrite(expand(s, vars));
  if (container.command) container.command = rewriteStrings(container.command, full);
  if (container.args) container.args = rewriteStrings(container.args, full);
  for (const key of ['livenessProbe', 'readinessProbe', 'startupProbe']) {
    const probe = container[key];
    if (!probe) continue;
    if (probe.exec?.command) probe.exec.command = rewriteStrings(probe.exec.command, full);
    for (const handler of ['tcpSocket', 'httpGet', 'grpc']) {
      if (!probe[handler]) continue;
      const port = pod.namedPorts.get(String(probe[handler].port));
      if (port === undefined) fail(`pod ${pod.name} ${key}`, `port ${probe[handler].port} is not a containerPort`);
      probe[handler].port = port;
    }
  }
  delete container.ports;
}

function translatePod(pod, ctx) {
  const sc = pod.spec.securityContext;
  if (sc?.fsGroup !== undefined) {
    const groups = new Set([...(sc.supplementalGroups || []), sc.fsGroup]);
    sc.supplementalGroups = [...groups];
  }
  translateVolumes(pod, ctx);
  if ((pod.spec.volumes || []).some((v) => v.name === HOSTS_VOLUME)) fail(`pod ${pod.name}`, `a volume is named ${HOSTS_VOLUME}`);
  pod.spec.volumes.push(hostsVolume(pod, ctx));
  for (const container of [...(pod.spec.initContainers || []), ...(pod.spec.containers || [])]) {
    translateContainer(pod, container, ctx, ctx.rewriters.get(pod.name));
    container.volumeMounts = [...(container.volumeMounts || []),
      { name: HOSTS_VOLUME, mountPath: '/etc/hosts', readOnly: true }];
  }
  pod.spec.hostNetwork = true;
  const ports = [...pod.namedPorts].filter(([k]) => !/^[0-9]+$/.test(k)).map(([k, v]) => `${k}=${v}`);
  pod.metadata.annotations[`${ANNOTATION}/ports`] = ports.join(',');
  // Prometheus' pod discovery reads the port to scrape from this annotation.
  const scrape = pod.metadata.annotations['prometheus.io/port'];
  if (scrape !== undefined && pod.namedPorts.has(String(scrape))) {
    pod.metadata.annotations['prometheus.io/port'] = String(pod.namedPorts.get(String(scrape)));
  }
  pod.metadata.annotations[`${ANNOTATION}/name`] = pod.name;
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { ...pod.metadata, name: ctx.prefix + pod.name },
    spec: pod.spec,
  };
}

// ---- everything ----------------------------------------------------------------
function secretData(secret) {
  const data = {};
  for (const [k, v] of Object.entries(secret.data || {})) data[k] = Buffer.from(v, 'base64');
  for (const [k, v] of Object.entries(secret.stringData || {})) data[k] = Buffer.from(v);
  return data;
}

export function translate(objects, options) {
  const ctx = {
    prefix: options.prefix || '',
    filesDir: options.filesDir || '',
    namespace: options.namespace || 'default',
    configMaps: new Map(),
    secrets: new Map(),
    usedConfigMaps: new Set(),
    claimUsers: new Map(),
  };
  const claims = [];
  const services = [];
  let pods = [];
  for (const object of objects) {
    const where = `${object.kind}/${object.metadata?.name}`;
    switch (object.kind) {
      case 'ConfigMap': ctx.configMaps.set(object.metadata.name, object); break;
      case 'Secret': ctx.secrets.set(object.metadata.name, secretData(object)); break;
      case 'PersistentVolumeClaim': claims.push(object); break;
      case 'Service': services.push(object); break;
      case 'NetworkPolicy': break;
      case 'StatefulSet': pods.push(...statefulSetPods(object)); break;
      case 'Job': pods.push(jobPod(object)); break;
      case 'Pod': pods.push(plainPod(object)); break;
      default: fail(where, `kind ${object.kind} is not translated`);
    }
  }

  // Ports over every pod (also with --only, so that a pod played again gets
  // the ports it had).
  assignPorts(pods);
  const hostnames = new Set();
  const rules = new Map(pods.map((p) => [p.name, []]));
  const addRule = (hosts, map, allowBare, onlyPod) => {
    for (const pod of pods) {
      if (onlyPod && pod !== onlyPod) continue;
      rules.get(pod.name).push({ hosts, map, allowBare });
    }
  };
  for (const service of services) {
    const name = service.metadata.name;
    dnsNames(name, ctx.namespace).forEach((h) => hostnames.add(h));
    const selected = pods.filter((p) => selects(service.spec?.selector, p.metadata.labels));
    const headless = service.spec?.clusterIP === 'None';
    for (const pod of pods) {
      if (!headless || pod.serviceName !== name) continue;
      dnsNames(`${pod.name}.${name}`, ctx.namespace).forEach((h) => hostnames.add(h));
    }
    if (headless) continue;
    // SERVICE:PORT reaches 127.0.0.1:PORT: where the selected pod listens
    // elsewhere, the clients' address moves with it.
    const map = new Map();
    for (const port of service.spec?.ports || []) {
      const target = String(port.targetPort ?? port.port);
      const actual = new Set(selected.map((p) => p.namedPorts.get(target)).filter((v) => v !== undefined));
      if (actual.size > 1) {
        fail(`Service/${name}`, `selects ${selected.length} pods listening on different host ports (${[...actual]}); one host network cannot balance them`);
      }
      const [hostPort] = actual;
      if (hostPort !== undefined && hostPort !== port.port) map.set(port.port, hostPort);
    }
    addRule(dnsNames(name, ctx.namespace), map, false);
  }
  for (const pod of pods) {
    // The pod's own listening addresses, and its DNS names from other pods.
    addRule(['0.0.0.0', LOOPBACK, 'localhost', '[::]', '[::1]'], pod.portMap, true, pod);
    const names = pod.serviceName ? dnsNames(`${pod.name}.${pod.serviceName}`, ctx.namespace) : [];
    if (names.length) addRule(names, pod.portMap, false);
  }
  ctx.hostnames = [...hostnames];
  ctx.rewriters = new Map([...rules].map(([name, r]) => [name, addressRewriter(r)]));

  for (const key of ['only', 'skip']) {
    const names = options[key];
    if (!names) continue;
    const unknown = [...names].filter((n) => !pods.some((p) => p.owner === n || p.name === n));
    if (unknown.length) fail(`--${key}`, `no workload named ${unknown.join(', ')}`);
    const keep = key === 'only';
    pods = pods.filter((p) => (names.has(p.owner) || names.has(p.name)) === keep);
  }
  const podObjects = pods.map((pod) => translatePod(pod, ctx));
  const out = [];
  for (const name of ctx.usedConfigMaps) {
    const cm = ctx.configMaps.get(name);
    if (cm) out.push({ ...cm, metadata: { ...cm.metadata, name: ctx.prefix + name } });
  }
  if (!options.only) {
    for (const claim of [...claims, ...pods.flatMap((p) => p.claims)]) {
      const users = ctx.claimUsers.get(claim.metadata.name) || [];
      const annotations = { ...(claim.metadata.annotations || {}) };
      const user = users.map((p) => p.spec.securityContext?.runAsUser).find((v) => v !== undefined);
      const group = users.map((p) => p.spec.securityContext?.fsGroup).find((v) => v !== undefined);
      if (user !== undefined) annotations['volume.podman.io/uid'] = String(user);
      if (group !== undefined) annotations['volume.podman.io/gid'] = String(group);
      out.push({ ...claim, metadata: { ...claim.metadata, name: ctx.prefix + claim.metadata.name, annotations } });
    }
  }
  out.push(...podObjects);
  return out;
}

function main() {
  const options = parseOptions(process.argv.slice(2));
  const input = readFileSync(0, 'utf8');
  const objects = [];
  for (const doc of parseAllDocuments(input)) {
    if (doc.errors.length) fail('input', doc.errors[0].message);
    const object = doc.toJS();
    if (object === null || object === undefined) continue;
    if (object.kind === 'List') objects.push(...object.items);
    else objects.push(object);
  }
  const out = translate(objects, options);
  process.stdout.write('# podman kube play input, made by deploy/podman-play.mjs from rendered manifests\n');
  process.stdout.write(out.map((o) => stringify(o, { lineWidth: 0 })).join('---\n'));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  try {
    main();
  } catch (error) {
    if (!(error instanceof TranslateError)) throw error;
    process.stderr.write(`podman-play: ${error.message}\n`);
    process.exit(1);
  }
}
