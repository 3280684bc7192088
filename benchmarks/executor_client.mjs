// Executors of the executor API benchmark (benchmarks/executor_api.py), in a process of
// their own: EXECUTORS concurrent loops, each on one keep-alive HTTP connection, drain the
// ready tasks of DEFINITION, then print one JSON line: tasks done, requests sent, seconds
// from the first request to the last answer.
//
//   node benchmarks/executor_client.mjs BASE_URL TOKEN DEFINITION MODE EXECUTORS [BATCH]
//
// MODE "single": poll (limit 1) -> start -> success, one task per call (three requests per task).
// MODE "batch": claim (limit BATCH) -> complete (every task claimed, in one call).
// A loop stops when its poll or claim comes back empty (the backlog is drained).
import http from "node:http";

const [base, token, definition, mode, executors, batch = "1"] = process.argv.slice(2);
const url = new URL(base);

function client() {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  let requests = 0;
  function post(path, body) {
    requests += 1;
    const data = JSON.stringify(body);
    return new Promise((resolve, reject) => {
      const request = http.request(
        {
          agent,
          host: url.hostname,
          port: url.port,
          method: "POST",
          path: `${url.pathname}/${path}`,
          headers: {
            Authorization: `Bearer ${token}`,
            "Content-Type": "application/json",
            "Content-Length": Buffer.byteLength(data),
          },
        },
        (response) => {
          const chunks = [];
          response.on("data", (chunk) => chunks.push(chunk));
          response.on("end", () => {
            const text = Buffer.concat(chunks).toString();
            if (response.statusCode >= 300) {
              reject(new Error(`${path}: ${response.statusCode} ${text}`));
            } else {
              resolve(JSON.parse(text));
            }
          });
        },
      );
      request.on("error", reject);
      request.end(data);
    });
  }
  return { post, requests: () => requests, close: () => agent.destroy() };
}

async function single(api) {
  let done = 0;
  for (;;) {
    const { tasks } = await api.post("poll", { definitions: [definition], limit: 1 });
    if (tasks.length === 0) return done;
    for (const task of tasks) {
      const execution = { exec_id: task.exec_id };
      await api.post(`${task.id}/start`, execution);
      await api.post(`${task.id}/success`, { ...execution, result: { ok: true } });
      done += 1;
    }
  }
}

async function batched(api) {
  let done = 0;
  for (;;) {
    const { tasks } = await api.post("claim", {
      definitions: [definition],
      limit: Number(batch),
    });
    if (tasks.length === 0) return done;
    const reports = tasks.map((task) => ({
      id: task.id,
      exec_id: task.exec_id,
      outcome: "succeeded",
      result: { ok: true },
    }));
    const { results } = await api.post("complete", { tasks: reports });
    const refused = results.filter((result) => !result.ok);
    if (refused.length) throw new Error(`refused: ${JSON.stringify(refused[0])}`);
    done += results.length;
  }
}

const clients = Array.from({ length: Number(executors) }, client);
const run = mode === "batch" ? batched : single;
const began = performance.now();
const counts = await Promise.all(clients.map(run));
const seconds = (performance.now() - began) / 1000;
const requests = clients.reduce((sum, api) => sum + api.requests(), 0);
clients.forEach((api) => api.close());
console.log(JSON.stringify({ done: counts.reduce((a, b) => a + b, 0), requests, seconds }));
