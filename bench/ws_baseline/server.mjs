// The baseline of bench/fanout_bench.cpp: a minimal websocket broadcast server on the npm `ws`
// package, as a team would write it without outlive. No auth, no window, no per-socket limits.
//
//   node server.mjs PORT            (listens on 127.0.0.1:PORT)
//
// - A socket on any path other than /publish is a subscriber: its first text message (the same
//   {"type":"sub",...} a tab sends outlive) is answered with {"type":"subscribed","id":...} and
//   from then on it receives every broadcast.
// - The socket on /publish is the bench driver: each message it sends is broadcast, as the same
//   bytes (one Buffer, framed once per socket by ws), to every subscriber.
import http from 'node:http';
import { WebSocketServer } from 'ws';

const port = Number(process.argv[2] || process.env.PORT || 8090);
const server = http.createServer((req, res) => {
  res.writeHead(req.url === '/healthz' ? 200 : 404, { 'content-type': 'text/plain' });
  res.end(req.url === '/healthz' ? 'ok\n' : 'not found\n');
});
// perMessageDeflate off (the ws default for servers; outlive does not compress either).
const wss = new WebSocketServer({ server, perMessageDeflate: false, maxPayload: 16 * 1024 });
const subscribers = new Set();

wss.on('connection', (ws, req) => {
  if (req.url === '/publish') {
    ws.on('message', (data) => {
      for (const s of subscribers) s.send(data, { binary: false });
    });
    return;
  }
  ws.once('message', (data) => {
    let id = null;
    try {
      id = JSON.parse(data.toString()).id ?? null;
    } catch {
      // not JSON: still a subscriber
    }
    subscribers.add(ws);
    ws.send(JSON.stringify({ type: 'subscribed', id }));
  });
  ws.on('close', () => subscribers.delete(ws));
  ws.on('error', () => subscribers.delete(ws));
});

server.listen(port, '127.0.0.1', () => {
  console.log(`ws baseline listening on 127.0.0.1:${port}`);
});
process.on('SIGTERM', () => process.exit(0));
