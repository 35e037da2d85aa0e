// Validates rendered Kubernetes manifests offline: every object against the
// Kubernetes schema (npm kubernetes-models), then lockstep's own rules.
//
//   node deploy/validate.mjs NAME=FILE.yaml [NAME=FILE.yaml ...]
//
// Each FILE is one rendering (kubectl kustomize output or a plain
// multi-document YAML file); rules that relate objects (a Service and the
// pods it selects, the coordinator's --cluster and the workers) look within
// one rendering. Prints one line per problem,
//   NAME: Kind/name: [rule] message
// and one summary line per rendering; exits 1 if any rendering has problems.
//
// Rules (names as printed):
//   schema                 the object validates against its Kubernetes model
//                          (a TFJob: each replica's pod template), has a name
//   duplicate              no two objects share kind and name
//   selector-labels        a workload's selector matches its pod template
//   service-selector       a Service's selector matches some pod template
//   worker-dns             a Service over lockstep workers is headless with
//                          publishNotReadyAddresses: true
//   probe-port-numeric     probe ports are numbers, not port names
//   probes                 lockstep daemons have readiness and liveness probes
//   gpu-request-limit      nvidia.com/gpu requests equal limits
//   gpu-toleration         a pod asking for GPUs tolerates nvidia.com/gpu
//   security-context       restricted: runAsNonRoot, a non-root runAsUser,
//                          allowPrivilegeEscalation false, readOnlyRootFilesystem
//                          true, capabilities drop ALL, seccomp RuntimeDefault
//   tmp-emptydir           /tmp is an emptyDir (the root filesystem is read-only)
//   resources              cpu and memory requests and limits on every container
//   grace-period           terminationGracePeriodSeconds > the worker's
//                          --preempt-grace (25 s by default)
//   indexed-job-parallelism an Indexed Job of workers runs every index at once
//   cluster-matches-workers the coordinator's --cluster lists exactly the
//                          worker pods: NAME-N.SERVICE:PORT for N < replicas
//                          (hot spares, lockstep-worker --spare, are not in it)
//   spare-identity         a worker started with --spare names no task
//                          identity (--task-type/--task-index) other than a
//                          "spare" task: a spare by flag registers freely
//   tls, tls-probes, network-policy
//                          mutual TLS from Secrets, exec probes that can do
//                          TLS, NetworkPolicies (validate_security.mjs)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { parseAllDocuments } from 'yaml';
import { securityProblems } from './validate_security.mjs';

const require = createRequire(import.meta.url);

// apiVersion -> module of kubernetes-models.
const GROUPS = {
  'v1': 'kubernetes-models/v1',
  'apps/v1': 'kubernetes-models/apps/v1',
  'batch/v1': 'kubernetes-models/batch/v1',
  'policy/v1': 'kubernetes-models/policy/v1',
  'networking.k8s.io/v1': 'kubernetes-models/networking.k8s.io/v1',
  'rbac.authorization.k8s.io/v1': 'kubernetes-models/rbac.authorization.k8s.io/v1',
  'autoscaling/v2': 'kubernetes-models/autoscaling/v2',
  'scheduling.k8s.io/v1': 'kubernetes-models/scheduling.k8s.io/v1',
};
const DEFAULT_PREEMPT_GRACE = 25;  // lockstep-worker --preempt-grace
const DEFAULT_TERMINATION_GRACE = 30;  // Kubernetes' default
const GPU = 'nvidia.com/gpu';

function modelFor(apiVersion, kind) {
  const path = GROUPS[apiVersion];
  if (!path) return undefined;
  const model = require(path)[kind];
  return typeof model === 'function' ? model : undefined;
}

function schemaErrors(obj) {
  const errors = [];
  if (!obj.metadata || !obj.metadata.name) errors.push('metadata.name is missing');
  if (obj.apiVersion === 'kubeflow.org/v1' && obj.kind === 'TFJob') {
    // No model for the CRD: check its pod templates as core/v1 PodTemplates.
    const PodTemplate = modelFor('v1', 'PodTemplate');
    const specs = obj.spec?.tfReplicaSpecs;
    if (!specs || typeof specs !== 'object') return [...errors, 'spec.tfReplicaSpecs is missing'];
    for (const [type, spec] of Object.entries(specs)) {
      if (!spec?.template) { errors.push(`tfReplicaSpecs.${type}.template is missing`); continue; }
      errors.push(...validateWith(PodTemplate, {
        apiVersion: 'v1', kind: 'PodTemplate', metadata: { name: 'x' }, template: spec.template,
      }).map((e) => `tfReplicaSpecs.${type}: ${e}`));
    }
    return errors;
  }
  const Model = modelFor(obj.apiVersion, obj.kind);
  if (!Model) return [...errors, `no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`];
  return [...errors, ...validateWith(Model, obj)];
}

function validateWith(Model, obj) {
  try {
    new Model(obj).validate();
    return [];
  } catch (error) {
    if (Array.isArray(error.errors)) {
      return error.errors.map((e) => `${e.instancePath || '/'} ${e.message}` +
        (e.params?.allowedValues ? ` (${e.params.allowedValues.join(', ')})` : ''));
    }
    return [String(error.message || error)];
  }
}

// The pod templates of an object: [{where, template, owner}].
function podTemplates(obj) {
  const spec = obj.spec || {};
  switch (obj.kind) {
    case 'Pod': return [{ where: '', template: { metadata: obj.metadata, spec } }];
    case 'Deployment': case 'StatefulSet': case 'DaemonSet': case 'ReplicaSet': case 'Job':
      return spec.template ? [{ where: 'spec.template', template: spec.template }] : [];
    case 'CronJob':
      return spec.jobTemplate?.spec?.template
        ? [{ where: 'spec.jobTemplate.spec.template', template: spec.jobTemplate.spec.template }] : [];
    case 'TFJob':
      return Object.entries(spec.tfReplicaSpecs || {})
        .filter(([, r]) => r?.template)
        .map(([type, r]) => ({ where: `tfReplicaSpecs.${type}.template`, template: r.template }));
    default: return [];
  }
}

function containersOf(podSpec) {
  return [...(podSpec?.initContainers || []), ...(podSpec?.containers || [])];
}

const commandLine = (c) => [...(c.command || []), ...(c.args || [])];
const runs = (c, binary) => commandLine(c).some((a) => typeof a === 'string' && a.split('/').pop() === binary);
const isWorker = (c) => runs(c, 'lockstep-worker');
const isCoordinator = (c) => runs(c, 'lockstep-coordinator');
// A hot spare by flag: it registers freely and is not a task of --cluster.
const isFreeSpare = (c) => isWorker(c) && commandLine(c).includes('--spare') &&
  flag(c, '--task-type') === undefined;

function flag(c, name) {
  const line = commandLine(c);
  for (let i = 0; i < line.length; i++) {
    if (line[i] === name) return line[i + 1];
    if (typeof line[i] === 'string' && line[i].startsWith(name + '=')) return line[i].slice(name.length + 1);
  }
  return undefined;
}

function selectorMatches(selector, labels) {
  if (!selector) return false;
  labels = labels || {};
  for (const [k, v] of Object.entries(selector.matchLabels || {})) {
    if (labels[k] !== v) return false;
  }
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const values = e.values || [];
    if (e.operator === 'In' && !(has && values.includes(labels[e.key]))) return false;
    if (e.operator === 'NotIn' && has && values.includes(labels[e.key])) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return true;
}

function quantity(q) {
  if (q === undefined || q === null) return undefined;
  return String(q);
}

function checkRendering(name, objects) {
  const problems = [];
  const report = (obj, rule, message) =>
    problems.push(`${name}: ${obj.kind}/${obj.metadata?.name ?? '?'}: [${rule}] ${message}`);

  const seen = new Set();
  for (const obj of objects) {
    for (const e of schemaErrors(obj)) report(obj, 'schema', e);
    const key = `${obj.apiVersion} ${obj.kind} ${obj.metadata?.namespace ?? ''} ${obj.metadata?.name}`;
    if (seen.has(key)) report(obj, 'duplicate', 'another object has the same kind and name');
    seen.add(key);
  }

  const templates = objects.flatMap((obj) => podTemplates(obj).map((t) => ({ ...t, obj })));

  // Workload selectors.
  for (const obj of objects) {
    if (!['Deployment', 'StatefulSet', 'DaemonSet', 'ReplicaSet', 'Job'].includes(obj.kind)) continue;
    const selector = obj.spec?.selector;
    if (!selector) {
      if (obj.kind !== 'Job') report(obj, 'selector-labels', 'spec.selector is missing');
      continue;  // a Job's selector is generated
    }
    const labels = obj.spec?.template?.metadata?.labels;
    if (!selectorMatches(selector, labels)) {
      report(obj, 'selector-labels', `spec.selector ${JSON.stringify(selector)} does not match the pod template's labels ${JSON.stringify(labels || {})}`);
    }
  }

  // Services.
  for (const svc of objects.filter((o) => o.kind === 'Service')) {
    const selector = svc.spec?.selector;
    if (!selector || Object.keys(selector).length === 0) continue;
    const selected = templates.filter((t) => selectorMatches({ matchLabels: selector }, t.template.metadata?.labels));
    if (selected.length === 0) {
      report(svc, 'service-selector', `selector ${JSON.stringify(selector)} matches no pod template here`);
    }
    if (selected.some((t) => containersOf(t.template.spec).some(isWorker))) {
      if (svc.spec.clusterIP !== 'None') report(svc, 'worker-dns', 'a Service over lockstep workers must be headless (clusterIP: None) so each pod has a DNS name');
      if (svc.spec.publishNotReadyAddresses !== true) report(svc, 'worker-dns', 'publishNotReadyAddresses must be true: peers must resolve a worker before it is ready');
    }
  }

  // Pod templates and containers.
  for (const { obj, where, template } of templates) {
    const pod = template.spec || {};
    const podSec = pod.securityContext || {};
    const volumes = Object.fromEntries((pod.volumes || []).map((v) => [v.name, v]));
    const at = (c) => `${where ? where + ': ' : ''}container ${c.name}`;
    let gpus = false;
    let preemptGrace;
    for (const c of containersOf(pod)) {
      // Probes.
      for (const kind of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
        const probe = c[kind];
        if (!probe) continue;
        for (const handler of ['httpGet', 'tcpSocket', 'grpc']) {
          const port = probe[handler]?.port;
          if (port !== undefined && typeof port !== 'number') {
            report(obj, 'probe-port-numeric', `${at(c)}: ${kind}.${handler}.port is ${JSON.stringify(port)}; use the port number`);
          }
        }
      }
      if ((isWorker(c) || isCoordinator(c)) && (!c.readinessProbe || !c.livenessProbe)) {
        report(obj, 'probes', `${at(c)}: a lockstep daemon needs a readinessProbe and a livenessProbe (grpc.health.v1)`);
      }
      // Resources.
      const requests = c.resources?.requests || {};
      const limits = c.resources?.limits || {};
      for (const r of ['cpu', 'memory']) {
        if (requests[r] === undefined) report(obj, 'resources', `${at(c)}: resources.requests.${r} is not set`);
        if (limits[r] === undefined) report(obj, 'resources', `${at(c)}: resources.limits.${r} is not set`);
      }
      if (requests[GPU] !== undefined || limits[GPU] !== undefined) {
        gpus = true;
        if (quantity(requests[GPU]) !== quantity(limits[GPU])) {
          report(obj, 'gpu-request-limit', `${at(c)}: ${GPU} requests (${quantity(requests[GPU]) ?? 'unset'}) must equal limits (${quantity(limits[GPU]) ?? 'unset'})`);
        }
      }
      // Restricted security context (the container's, falling back to the pod's).
      const sec = c.securityContext || {};
      const missing = [];
      if ((sec.runAsNonRoot ?? podSec.runAsNonRoot) !== true) missing.push('runAsNonRoot: true');
      const uid = sec.runAsUser ?? podSec.runAsUser;
      if (typeof uid !== 'number' || uid === 0) missing.push('a non-root runAsUser');
      if (sec.allowPrivilegeEscalation !== false) missing.push('allowPrivilegeEscalation: false');
      if (sec.readOnlyRootFilesystem !== true) missing.push('readOnlyRootFilesystem: true');
      if (sec.privileged === true) missing.push('privileged: false');
      if (!(sec.capabilities?.drop || []).includes('ALL')) missing.push('capabilities.drop: [ALL]');
      const seccomp = (sec.seccompProfile ?? podSec.seccompProfile)?.type;
      if (!['RuntimeDefault', 'Localhost'].includes(seccomp)) missing.push('seccompProfile.type: RuntimeDefault');
      if (missing.length > 0) {
        report(obj, 'security-context', `${at(c)}: not restricted; needs ${missing.join(', ')}`);
      }
      const tmp = (c.volumeMounts || []).find((m) => m.mountPath === '/tmp' || m.mountPath === '/tmp/');
      if (!tmp || !volumes[tmp.name]?.emptyDir) {
        report(obj, 'tmp-emptydir', `${at(c)}: mount an emptyDir volume at /tmp (the root filesystem is read-only)`);
      }
      if (isWorker(c)) {
        const value = flag(c, '--preempt-grace');
        const grace = value === undefined ? DEFAULT_PREEMPT_GRACE : Number(value);
        preemptGrace = Math.max(preemptGrace ?? 0, Number.isFinite(grace) ? grace : Infinity);
      }
    }
    if (gpus && !(pod.tolerations || []).some((t) => t.key === GPU || (t.operator === 'Exists' && !t.key))) {
      report(obj, 'gpu-toleration', `${where}: asks for ${GPU} but does not tolerate the ${GPU} taint`);
    }
    if (preemptGrace !== undefined) {
      const termination = pod.terminationGracePeriodSeconds ?? DEFAULT_TERMINATION_GRACE;
      if (!(termination > preemptGrace)) {
        report(obj, 'grace-period', `${where}: terminationGracePeriodSeconds ${termination} must exceed the worker's --preempt-grace ${preemptGrace} (time to save the agreed step)`);
      }
    }
  }

  // Indexed Jobs of workers: synchronous training needs every index at once.
  for (const job of objects.filter((o) => o.kind === 'Job' && o.spec?.completionMode === 'Indexed')) {
    if (!containersOf(job.spec.template?.spec).some(isWorker)) continue;
    const completions = job.spec.completions ?? 1;
    const parallelism = job.spec.parallelism ?? 1;
    if (parallelism !== completions) {
      report(job, 'indexed-job-parallelism', `parallelism ${parallelism} must equal completions ${completions}: every rank must run at once`);
    }
  }

  // Hot spares: --spare with a task identity would make the coordinator
  // refuse them or count them as ranks.
  for (const { obj, template } of templates) {
    for (const c of containersOf(template.spec).filter(isWorker)) {
      if (!commandLine(c).includes('--spare')) continue;
      const type = flag(c, '--task-type');
      if ((type !== undefined && type !== 'spare') ||
          (type === undefined && flag(c, '--task-index') !== undefined)) {
        report(obj, 'spare-identity', `container ${c.name}: --spare with task identity ${type ?? '(index only)'}; a spare by flag registers without --task-type/--task-index (or use --task-type spare with a "spare" list in --cluster)`);
      }
    }
  }

  // The coordinator's static cluster against the worker pods (spares apart).
  const workerSets = [];
  for (const obj of objects) {
    const pod = obj.spec?.template?.spec;
    if (!pod || !containersOf(pod).some((c) => isWorker(c) && !isFreeSpare(c))) continue;
    if (obj.kind === 'StatefulSet') {
      workerSets.push({ obj, replicas: obj.spec.replicas ?? 1, service: obj.spec.serviceName });
    } else if (obj.kind === 'Job' && obj.spec.completionMode === 'Indexed') {
      workerSets.push({ obj, replicas: obj.spec.completions ?? 1, service: pod.subdomain });
    }
  }
  for (const { obj, template } of templates) {
    for (const c of containersOf(template.spec).filter(isCoordinator)) {
      const value = flag(c, '--cluster');
      if (value === undefined || !value.trim().startsWith('{')) continue;  // none, or a file
      let cluster;
      try {
        cluster = JSON.parse(value);
        cluster = cluster.cluster ?? cluster;
      } catch (error) {
        report(obj, 'cluster-matches-workers', `container ${c.name}: --cluster is not valid JSON: ${error.message}`);
        continue;
      }
      const addresses = [...(cluster.chief || []), ...(cluster.worker || [])];
      if (workerSets.length === 0) continue;  // workers not rendered here
      const hosts = addresses.map((a) => String(a).replace(/:\d+$/, ''));
      const matched = workerSets.some(({ obj: set, replicas, service }) => {
        if (hosts.length !== replicas || (cluster.chief || []).length > 0) return false;
        return hosts.every((h, i) => h === `${set.metadata.name}-${i}.${service}` ||
          h.startsWith(`${set.metadata.name}-${i}.${service}.`));
      });
      if (!matched) {
        const expected = workerSets.map(({ obj: set, replicas, service }) =>
          `${set.kind}/${set.metadata.name}: ${Array.from({ length: replicas }, (_, i) => `${set.metadata.name}-${i}.${service}:PORT`).join(', ')}`).join('; or ');
        report(obj, 'cluster-matches-workers', `container ${c.name}: --cluster workers ${JSON.stringify(addresses)} are not the worker pods (${expected})`);
      }
    }
  }
  securityProblems({ containersOf, commandLine, runs, isWorker, isCoordinator, flag, selectorMatches },
    objects, templates, report);
  return problems;
}

function load(file) {
  const objects = [];
  const errors = [];
  for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
    if (doc.errors.length > 0) {
      errors.push(...doc.errors.map((e) => e.message));
      continue;
    }
    const obj = doc.toJS();
    if (obj === null || obj === undefined) continue;
    if (typeof obj !== 'object' || Array.isArray(obj) || Object.keys(obj).length === 0) {
      errors.push(`a document is not a Kubernetes object: ${JSON.stringify(obj).slice(0, 80)}`);
      continue;
    }
    if (obj.kind === 'List' && Array.isArray(obj.items)) objects.push(...obj.items);
    else objects.push(obj);
  }
  return { objects, errors };
}

const args = process.argv.slice(2);
if (args.length === 0 || args.includes('--help')) {
  console.log('usage: node validate.mjs NAME=FILE.yaml [NAME=FILE.yaml ...]');
  process.exit(args.length === 0 ? 2 : 0);
}
let failed = false;
for (const arg of args) {
  const eq = arg.indexOf('=');
  const [name, file] = eq > 0 ? [arg.slice(0, eq), arg.slice(eq + 1)] : [arg, arg];
  let loaded;
  try {
    loaded = load(file);
  } catch (error) {
    console.log(`${name}: [yaml] cannot read ${file}: ${error.message}`);
    failed = true;
    continue;
  }
  const problems = [
    ...loaded.errors.map((e) => `${name}: [yaml] ${e}`),
    ...(loaded.objects.length === 0 ? [`${name}: [yaml] no objects`] : []),
    ...checkRendering(name, loaded.objects),
  ];
  for (const p of problems) console.log(p);
  const kinds = loaded.objects.length;
  console.log(problems.length === 0
    ? `ok ${name}: ${kinds} objects`
    : `FAILED ${name}: ${problems.length} problems in ${kinds} objects`);
  if (problems.length > 0) failed = true;
}
process.exit(failed ? 1 : 0);
