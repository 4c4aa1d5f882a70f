// Writes a copy of a manifest file with one change to one of its objects, for the validator's
// negative cases. Comments and the other documents stay as they are.
// Usage: node mutate.mjs IN OUT KIND/NAME OP PATH [JSON]
//   OP set: PATH must exist, its value becomes JSON; add: PATH must not exist, it is added with
//   JSON; delete: PATH must exist and is removed. PATH is a JSON pointer without the leading
//   slash (segments split on "/", "~1" for a "/" in a key, numbers index lists).
import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const [inFile, outFile, target, op, pointer, json] = process.argv.slice(2);
const die = msg => { console.error(`mutate: ${msg}`); process.exit(2); };
const path = pointer.split("/").map(s => /^[0-9]+$/.test(s) ? Number(s) : s.replaceAll("~1", "/").replaceAll("~0", "~"));
const docs = parseAllDocuments(readFileSync(inFile, "utf8"));
const doc = docs.find(d => `${d.get("kind")}/${d.getIn(["metadata", "name"])}` === target);
if (!doc) die(`${inFile} has no ${target}`);
const exists = doc.hasIn(path);
if (op === "set" || op === "delete") { if (!exists) die(`${target} has no ${pointer}`); }
else if (op === "add") { if (exists) die(`${target} already has ${pointer}`); }
else die(`unknown op ${op}`);
if (op === "delete") doc.deleteIn(path);
else doc.setIn(path, JSON.parse(json));
writeFileSync(outFile, docs.map((d, i) => {
  const s = d.toString();
  return i && !s.startsWith("---") ? `---\n${s}` : s;
}).join(""));
