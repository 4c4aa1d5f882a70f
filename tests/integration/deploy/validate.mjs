// Validates Kubernetes manifests offline, as an API server with strict field validation would
// take them, then what no schema sees across documents.
// 1. Each document against the OpenAPI schema of its apiVersion/kind, as compiled by npm
//    kubernetes-models (the Kubernetes 1.27 OpenAPI, pinned by package-lock.json): types,
//    required fields, enums, formats. An apiVersion/kind it does not have, or of a group
//    version Kubernetes no longer serves, is refused.
// 2. Unknown fields (`kubectl apply --validate=strict`): the schemas do not forbid them, so the
//    document is validated through a Proxy that records which keys the compiled validator
//    reads; a key it never reads is not in the schema (maps such as labels are iterated, so
//    all their keys are read).
// 3. Across documents: namespaced objects live in a Namespace of the set; a StatefulSet's
//    selector matches its pod labels and its serviceName is a headless Service of the set;
//    every volumeMount names a volume or claim template; every ConfigMap a pod uses (volume, env
//    key) is in the set with that key; every Secret is in the set or named by
//    --external-secret; every Service selects a pod and its targetPorts are that pod's ports.
// Usage: node validate.mjs [--external-secret NAME]... FILE...
// Exit 0 if valid; else 1 with one line per problem on stderr.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const files = [];
const external = new Set();
for (let i = 2; i < process.argv.length; i++) {
  if (process.argv[i] === "--external-secret") external.add(process.argv[++i]);
  else files.push(process.argv[i]);
}

// Wraps v so that every key read of every object below it is recorded in seen.
function track(v, path, seen) {
  if (v === null || typeof v !== "object") return v;
  const read = new Set();
  const kids = new Map();
  seen.push({ path, obj: v, read });
  return new Proxy(v, {
    get(t, k, r) {
      const x = Reflect.get(t, k, r);
      if (typeof k !== "string") return x;
      read.add(k);
      if (x === null || typeof x !== "object") return x;
      if (!kids.has(k)) kids.set(k, track(x, `${path}/${k}`, seen));
      return kids.get(k);
    },
    has(t, k) {
      if (typeof k === "string") read.add(k);
      return Reflect.has(t, k);
    },
  });
}

// The GA group versions (kubernetes-models also has the beta ones that Kubernetes 1.16-1.26
// stopped serving, such as apps/v1beta1: refused here).
const SERVED = new Set(["v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v2",
  "networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1",
  "scheduling.k8s.io/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1", "node.k8s.io/v1"]);

async function model(apiVersion, kind) {
  if (!SERVED.has(apiVersion) || !/^[A-Z][A-Za-z]+$/.test(kind || "")) return null;
  try {
    return (await import(`kubernetes-models/${apiVersion}/${kind}`))[kind] ?? null;
  } catch {
    return null;
  }
}

const problems = [];
const objs = [];
for (const file of files) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) { problems.push(`${file}: YAML: ${doc.errors[0].message}`); continue; }
    const o = doc.toJS();
    if (o == null) continue;
    const where = `${file}: ${o.kind}/${o.metadata?.name}`;
    const Model = await model(o.apiVersion, o.kind);
    if (!Model) { problems.push(`${where}: unsupported apiVersion/kind ${o.apiVersion}/${o.kind}`); continue; }
    const seen = [];
    try {
      Model.prototype.validate.call(track(o, "", seen));
    } catch (e) {
      problems.push(`${where}: schema: ${e.message}`);
      continue;
    }
    let unknown = 0;
    for (const { path, obj, read } of seen)
      if (!Array.isArray(obj))
        for (const k of Object.keys(obj))
          if (!read.has(k)) { problems.push(`${where}: unknown field ${path.slice(1)}${path ? "/" : ""}${k}`); unknown++; }
    if (!unknown) objs.push({ o, where });
  }
}

const find = (kind, name) => objs.find(x => x.o.kind === kind && x.o.metadata.name === name)?.o;
const matches = (sel, labels) => Object.entries(sel || {}).every(([k, v]) => labels?.[k] === v);
const podsOf = objs.filter(x => x.o.kind === "StatefulSet").map(x => x.o.spec.template);
const secret = (where, what, name) => {
  if (!find("Secret", name) && !external.has(name))
    problems.push(`${where}: ${what}: Secret ${name} is neither in the set nor created beforehand`);
};
for (const { o, where } of objs) {
  if (o.kind !== "Namespace" && !find("Namespace", o.metadata.namespace))
    problems.push(`${where}: namespace ${o.metadata.namespace} is not in the set`);
  if (o.kind === "StatefulSet") {
    const labels = o.spec.template.metadata?.labels;
    if (!matches(o.spec.selector.matchLabels, labels))
      problems.push(`${where}: selector does not match the pod template's labels`);
    const svc = find("Service", o.spec.serviceName);
    if (!svc || svc.spec.clusterIP !== "None")
      problems.push(`${where}: serviceName ${o.spec.serviceName} is not a headless Service of the set`);
    const spec = o.spec.template.spec;
    const volumes = new Set([...(spec.volumes || []), ...(o.spec.volumeClaimTemplates || [])]
      .map(v => v.name ?? v.metadata?.name));
    for (const v of spec.volumes || []) {
      if (v.configMap) {
        const cm = find("ConfigMap", v.configMap.name);
        if (!cm) problems.push(`${where}: volume ${v.name}: ConfigMap ${v.configMap.name} is not in the set`);
        for (const it of v.configMap.items || [])
          if (cm && !(it.key in (cm.data || {})))
            problems.push(`${where}: volume ${v.name}: ConfigMap ${v.configMap.name} has no key ${it.key}`);
      }
      if (v.secret) secret(where, `volume ${v.name}`, v.secret.secretName);
    }
    for (const c of [...(spec.initContainers || []), ...spec.containers]) {
      for (const m of c.volumeMounts || [])
        if (!volumes.has(m.name))
          problems.push(`${where}: container ${c.name}: volumeMount ${m.name} is no volume of the pod`);
      for (const e of c.env || []) {
        const ref = e.valueFrom?.configMapKeyRef;
        if (ref && !((find("ConfigMap", ref.name)?.data || {})[ref.key]))
          problems.push(`${where}: env ${e.name}: ConfigMap ${ref.name} has no key ${ref.key}`);
        if (e.valueFrom?.secretKeyRef) secret(where, `env ${e.name}`, e.valueFrom.secretKeyRef.name);
      }
    }
  }
  if (o.kind === "Service") {
    const pods = podsOf.filter(t => matches(o.spec.selector, t.metadata?.labels));
    if (!pods.length) problems.push(`${where}: its selector matches no pod of the set`);
    for (const p of o.spec.ports || []) {
      const target = p.targetPort ?? p.port;
      for (const t of pods) {
        const ports = t.spec.containers.flatMap(c => c.ports || []);
        if (!ports.some(cp => cp.name === target || cp.containerPort === target))
          problems.push(`${where}: port ${p.name ?? p.port}: targetPort ${target} is not a port of its pods`);
      }
    }
  }
}
for (const p of problems) console.error(p);
process.exit(problems.length ? 1 : 0);
