// Validates Kubernetes manifests offline: each document against the Kubernetes JSON schema of
// its kind (kubernetes-models, pinned by package-lock.json), then what the schemas cannot see
// across documents: a StatefulSet's selector matches its pod labels and names a headless
// Service of the set, every ConfigMap a pod uses (volume or env key) is in the set with that
// key, every Service selects some pod, namespaced objects live in a Namespace of the set.
// Usage: node validate.mjs FILE...   Exit 0 if valid, 1 with one line per problem.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { Namespace } from "kubernetes-models/v1/Namespace";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Service } from "kubernetes-models/v1/Service";
import { StatefulSet } from "kubernetes-models/apps/v1/StatefulSet";

const kinds = { "v1/Namespace": Namespace, "v1/ConfigMap": ConfigMap, "v1/Service": Service,
                "apps/v1/StatefulSet": StatefulSet };
const problems = [];
const objs = [];
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) { problems.push(`${file}: YAML: ${doc.errors[0].message}`); continue; }
    const o = doc.toJS();
    if (o == null) continue;
    const where = `${file}: ${o.kind}/${o.metadata?.name}`;
    const Model = kinds[`${o.apiVersion}/${o.kind}`];
    if (!Model) { problems.push(`${where}: unsupported apiVersion/kind ${o.apiVersion}/${o.kind}`); continue; }
    try { new Model(o).validate(); } catch (e) { problems.push(`${where}: schema: ${e.message}`); continue; }
    objs.push({ o, where });
  }
}
const find = (kind, name) => objs.find(x => x.o.kind === kind && x.o.metadata.name === name)?.o;
const matches = (sel, labels) => Object.entries(sel || {}).every(([k, v]) => labels?.[k] === v);
const pods = objs.filter(x => x.o.kind === "StatefulSet");
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
    for (const v of spec.volumes || [])
      if (v.configMap && !find("ConfigMap", v.configMap.name))
        problems.push(`${where}: volume ${v.name}: ConfigMap ${v.configMap.name} is not in the set`);
    for (const c of spec.containers)
      for (const e of c.env || []) {
        const ref = e.valueFrom?.configMapKeyRef;
        if (ref && !(find("ConfigMap", ref.name)?.data || {})[ref.key])
          problems.push(`${where}: env ${e.name}: ConfigMap ${ref.name} has no key ${ref.key}`);
      }
  }
  if (o.kind === "Service" && !pods.some(p => matches(o.spec.selector, p.o.spec.template.metadata?.labels)))
    problems.push(`${where}: its selector matches no pod of the set`);
}
for (const p of problems) console.error(p);
process.exit(problems.length ? 1 : 0);
