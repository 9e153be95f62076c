// publisher_bench: how fast outlive drains a pre-filled outbox, against the two ceilings it sits
// between (a raw nats.c async publish of the same messages, a Postgres-only claim-and-delete loop),
// and the commit-to-ack latency at half of that rate. Everything runs on this machine in one run:
// an embedded PostgreSQL 15 and nats-server on loopback (src/harness), a fresh database and a fresh
// stream per phase. Prints a Markdown table (docs/BENCHMARKS.md).
//
//   build/bench/publisher_bench [--updates N] [--keys K] [--timeout S] [--latency-seconds S]
//                               [--writers W] [--batches-in-flight B] [--extra-batches-in-flight
//                               B1,B2]
//                               [--extra-stale-stats] [--no-extra-ceilings] [--no-analyze]
//                               [--repeat R]
//                               [--latency-rate R] [--only LABEL,...] [--pg-dir DIR]
//                               [--auto-explain-ms MS]
//
// Rows: 1 outlive's Publisher (partitions) draining the pre-filled outbox, 1r2 two of them, 1L
// today's lease claim (bench/legacy_publisher.cpp over legacy.claim); 2 raw nats.c async publish
// of the same messages; 3 the new claim's Postgres floor (PartitionStore reads + deletes), 3L
// today's (legacy.claim + DELETE); 3N Postgres and NATS together doing the least a drain needs
// (reads by position, raw nats.c publishes with no order per key, deletes on ack); 4 ratios
// 1 / min(2, 3), 1 / 1L, 1r2 / 1, 1 / 3N; 5 commit-to-ack
// latency at 0.5 x (1), 5F its floor in the same run (the wake's listener deletes and publishes
// the rows at once), 5L the same with today's claim (5F and 5L come with 5). Extra rows: 1a.. other
// batches_in_flight, 1s the drain with the planner statistics of an empty outbox, 2a raw nats.c
// with SendAsap, 2b topic::Client pipelined. Every phase gives up after --timeout seconds; the
// whole run after (phases + 1) x --timeout.
#include <poll.h>

#include <nats/nats.h>
#include <sys/resource.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench/common.hpp"
#include "bench/legacy_publisher.hpp"
#include "common/log.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "outbox/migrate.hpp"
#include "outbox/partitions.hpp"
#include "publisher/horizon.hpp"
#include "publisher/publisher.hpp"
#include "publisher/settler.hpp"
#include "topic/client.hpp"

using namespace outlive;
using namespace outlive::bench;
using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------------------------------------
// Flags

struct Flags {
  int updates = 100'000;
  int keys = 1'000;
  int timeout_s = 120;  // every phase is abandoned after this
  double latency_seconds = 5.0;
  int writers = 4;
  int batches_in_flight = publisher::Options{}.batches_in_flight;
  std::vector<int> extra_batches_in_flight;
  bool extra_ceilings = true;
  bool analyze = true;
  bool extra_stale_stats = false;  // an extra row drained with the statistics of an empty outbox
  int repeat = 1;                  // phases 1-3 and the extra rows: median of this many runs
  double latency_rate = 0;         // 0: 0.5 x (1)
  std::vector<std::string> only;   // diagnostics: run only these rows (labels: 1 2 3 5 1a 1s 2a 2b)
  std::string pg_dir;              // diagnostics: keep Postgres' data dir and log here
  int auto_explain_ms = 0;         // diagnostics: log plans of statements slower than this
  std::string command;
};

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "publisher_bench: " << error << "\n"
            << "usage: publisher_bench [--updates N] [--keys K] [--timeout SECONDS] "
               "[--latency-seconds S]\n"
               "                       [--writers W] [--batches-in-flight B] "
               "[--extra-batches-in-flight B1,B2,...]\n"
               "                       [--no-extra-ceilings] [--no-analyze] [--repeat R] "
               "[--extra-stale-stats]\n"
               "                       [--latency-rate UPDATES_PER_S] [--only LABEL,...]\n"
               "                       [--pg-dir DIR] [--auto-explain-ms MS]   (diagnostics: keep "
               "postgres.log, log slow plans)\n";
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  f.command = "build/bench/publisher_bench";
  for (int i = 1; i < argc; ++i) f.command += std::string(" ") + argv[i];
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto positive = [&](const std::string& name, const std::string& v) {
    try {
      const long n = std::stol(v);
      if (n < 1 || n > 100'000'000) throw std::out_of_range(v);
      return static_cast<int>(n);
    } catch (const std::exception&) {
      usage(name + " must be a positive integer, got " + v);
    }
  };
  auto real = [&](const std::string& name, const std::string& v) {
    try {
      return std::stod(v);
    } catch (const std::exception&) {
      usage(name + " must be a number, got " + v);
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--updates")
      f.updates = positive(a, value(i));
    else if (a == "--keys")
      f.keys = positive(a, value(i));
    else if (a == "--timeout")
      f.timeout_s = positive(a, value(i));
    else if (a == "--latency-seconds")
      f.latency_seconds = real(a, value(i));
    else if (a == "--writers")
      f.writers = positive(a, value(i));
    else if (a == "--batches-in-flight")
      f.batches_in_flight = positive(a, value(i));
    else if (a == "--extra-batches-in-flight") {
      std::stringstream ss(value(i));
      for (std::string item; std::getline(ss, item, ',');) {
        if (!item.empty()) f.extra_batches_in_flight.push_back(positive(a, item));
      }
    } else if (a == "--no-extra-ceilings")
      f.extra_ceilings = false;
    else if (a == "--no-analyze")
      f.analyze = false;
    else if (a == "--extra-stale-stats")
      f.extra_stale_stats = true;
    else if (a == "--repeat")
      f.repeat = positive(a, value(i));
    else if (a == "--latency-rate")
      f.latency_rate = real(a, value(i));
    else if (a == "--only") {
      std::stringstream ss(value(i));
      for (std::string item; std::getline(ss, item, ',');) {
        if (!item.empty()) f.only.push_back(item);
      }
    } else if (a == "--pg-dir")
      f.pg_dir = value(i);
    else if (a == "--auto-explain-ms")
      f.auto_explain_ms = positive(a, value(i));
    else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage("unknown flag " + a);
  }
  if (f.latency_seconds <= 0 || f.latency_seconds > 60)
    usage("--latency-seconds must be in (0, 60]");
  const bool only_has_1 = std::find(f.only.begin(), f.only.end(), "1") != f.only.end();
  const bool only_has_5 = std::find(f.only.begin(), f.only.end(), "5") != f.only.end();
  if (!f.only.empty() && only_has_5 && !only_has_1 && f.latency_rate <= 0)
    usage("--only 5 without 1 needs --latency-rate");
  if (f.repeat > 9) usage("--repeat must be at most 9");
  return f;
}

// ---------------------------------------------------------------------------------------------
// CPU time of this process, of the postgres server (postmaster, its live backends and the
// backends it reaped) and of nats-server, from /proc: where the cores went during a phase.

struct Cpu {
  double bench = 0, postgres = 0, nats = 0;
  Cpu operator-(const Cpu& o) const {
    return {bench - o.bench, postgres - o.postgres, nats - o.nats};
  }
};

Cpu sample_cpu() {
  const ServiceCpu services = service_cpu(read_procs());
  return {self_cpu_seconds(), services.postgres, services.nats};
}

std::string cpu_text(const Cpu& c) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f / %.1f / %.1f", c.bench, c.postgres, c.nats);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Services and per-phase setup

std::string pg_array(const std::vector<int64_t>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out + "}";
}

harness::PostgresOptions postgres_options(const Flags& flags) {
  harness::PostgresOptions o;
  o.data_dir = flags.pg_dir;
  return o;
}

struct Services {
  explicit Services(const Flags& f) : flags(f), postgres(postgres_options(f)) {}
  const Flags& flags;
  harness::EmbeddedPostgres postgres;
  harness::EmbeddedNats nats;
  int databases = 0;

  // A fresh, migrated database; function timing on so events.claim's own cost can be read back.
  std::string fresh_database() {
    const std::string name =
        "bench_" + std::to_string(getpid()) + "_" + std::to_string(++databases);
    const std::string url = postgres.create_database(name);
    outbox::migrate(url);
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("ALTER DATABASE \"" + name + "\" SET track_functions = 'pl'");
    if (flags.auto_explain_ms > 0) {
      for (const std::string& setting :
           {std::string("session_preload_libraries = 'auto_explain'"),
            "auto_explain.log_min_duration = '" + std::to_string(flags.auto_explain_ms) + "ms'",
            std::string("auto_explain.log_nested_statements = on"),
            std::string("auto_explain.log_analyze = on"),
            std::string("auto_explain.log_buffers = on"),
            std::string("auto_explain.log_timing = off")}) {
        pqxx::nontransaction(c).exec("ALTER DATABASE \"" + name + "\" SET " + setting);
      }
    }
    return url;
  }
};

void set_timeout(pqxx::connection& c, int timeout_s) {
  pqxx::nontransaction(c).exec("SET statement_timeout = '" + std::to_string(timeout_s) + "s'");
}

enum class Statistics { fresh, of_empty_outbox };

// One statement, one transaction: N updates over K keys through events.publish_live.
double prefill(const std::string& url, const std::string& app, const Flags& flags,
               Statistics statistics = Statistics::fresh) {
  const auto start = Steady::now();
  pqxx::connection c(url);
  set_timeout(c, flags.timeout_s);
  // What autovacuum usually sees of an outbox: nothing pending. The backlog then arrives unseen
  // by the planner (until autovacuum analyzes again, within about a minute).
  if (statistics == Statistics::of_empty_outbox)
    pqxx::nontransaction(c).exec("ANALYZE events.outbox");
  {
    pqxx::work tx(c);
    tx.exec_params(
        "SELECT events.publish_live($1, 'k' || (i % $2), jsonb_build_object('n', i))"
        " FROM generate_series(1, $3) i",
        app, flags.keys, flags.updates);
    tx.commit();
  }
  // The planner's statistics for the backlog (autovacuum would gather them within a minute).
  if (flags.analyze && statistics == Statistics::fresh)
    pqxx::nontransaction(c).exec("VACUUM ANALYZE events.outbox");
  return seconds_since(start);
}

int64_t outbox_rows(const std::string& url) {
  pqxx::connection c(url);
  return pqxx::nontransaction(c).exec("SELECT count(*) FROM events.outbox")[0][0].as<int64_t>();
}

struct ClaimStats {
  int64_t calls = 0;
  double total_ms = 0;
};

ClaimStats claim_stats(const std::string& url, const std::string& schema = "legacy") {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  const auto r = tx.exec(
      "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_time), 0)::float8 FROM "
      "pg_stat_user_functions"
      " WHERE schemaname = " +
      tx.quote(schema) + " AND funcname = 'claim'");
  return {r[0][0].as<int64_t>(), r[0][1].as<double>()};
}

struct Message {
  std::string id;
  std::string envelope;
  std::string created_at_us;
};

// The messages the publisher would send for a pre-filled outbox, in claim (position) order.
std::vector<Message> outbox_messages(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  const auto r = tx.exec(
      "SELECT id::text, envelope::text, (extract(epoch FROM created_at) * 1000000)::bigint::text"
      " FROM events.outbox ORDER BY position");
  std::vector<Message> out;
  out.reserve(r.size());
  for (const auto& row : r)
    out.push_back({row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<std::string>()});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Results

struct Row {
  std::string label;
  std::string what;
  int64_t updates = 0;
  double seconds = 0;
  double rate = 0;  // updates/s; 0 when the phase failed
  std::string cpu;
  std::string notes;
  bool ok = false;
};

Row failed_row(std::string label, std::string what, const std::string& error) {
  Row r;
  r.label = std::move(label);
  r.what = std::move(what);
  r.notes = "FAILED: " + error;
  std::cerr << "phase " << r.label << " failed: " << error << "\n";
  return r;
}

void progress(const std::string& text) { std::cerr << "[publisher_bench] " << text << std::endl; }

// Of the repeated runs of one phase, the run with the median rate (a failed run counts as 0), with
// every run's rate in its notes: the machine may be shared, one run can be unlucky.
Row median_of(std::vector<Row> runs) {
  const size_t times = runs.size();
  if (times == 1) return runs.front();
  std::vector<std::string> rates;
  for (const auto& r : runs)
    rates.push_back(r.rate > 0 ? thousands(r.rate) : std::string("failed"));
  std::sort(runs.begin(), runs.end(), [](const Row& a, const Row& b) { return a.rate < b.rate; });
  Row median = runs[runs.size() / 2];
  std::string all;
  for (size_t i = 0; i < rates.size(); ++i) all += (i ? ", " : "") + rates[i];
  median.notes = "median of " + std::to_string(times) + " interleaved runs (" + all +
                 " updates/s), this run: " + median.notes;
  for (const auto& r : runs) median.ok = median.ok && r.ok;
  return median;
}

// ---------------------------------------------------------------------------------------------
// (1) outlive's Publisher draining a pre-filled outbox

enum class Claim { partitions, legacy, floor };

// (1) with `replicas` Publishers side by side (each its own NATS connection), or (1L) today's
// lease claim, the same loop over legacy.claim.
template <typename Pub>
Row drain_phase(Services& s, const Flags& flags, const std::string& label, const std::string& app,
                int batches_in_flight, Statistics statistics, int replicas, Claim claim) {
  const std::string what =
      std::string(claim == Claim::legacy ? "today's lease claim (legacy.claim, the publisher of "
                                           "cf66cc2)"
                                         : "outlive Publisher (partitions)") +
      (replicas > 1 ? ", " + std::to_string(replicas) + " replicas in-process" : ", in-process") +
      ", default Options" +
      std::string(batches_in_flight == publisher::Options{}.batches_in_flight
                      ? ""
                      : " except batches_in_flight") +
      " (batches_in_flight=" + std::to_string(batches_in_flight) + ")" +
      (statistics == Statistics::of_empty_outbox
           ? "; planner statistics of the empty outbox (ANALYZE before the prefill)"
           : "");
  try {
    const std::string url = s.fresh_database();
    if (claim == Claim::legacy) legacy_claim::install(url);
    const double fill_s = prefill(url, app, flags, statistics);
    topic::Client client({s.nats.url()}, "publisher-bench");
    client.ensure_stream(app, topic::StreamSettings{});

    std::vector<std::unique_ptr<topic::Client>> clients;
    std::vector<std::unique_ptr<Pub>> pubs;
    std::mutex m;
    std::condition_variable cv;
    std::atomic<int64_t> acked{0};
    Steady::time_point done_at{};
    for (int i = 0; i < replicas; ++i) {
      clients.push_back(std::make_unique<topic::Client>(std::vector<std::string>{s.nats.url()},
                                                        "publisher-bench-" + std::to_string(i)));
      publisher::Options options;
      options.replica = "r" + std::to_string(i + 1);
      options.apps = {app};
      options.batches_in_flight = batches_in_flight;
      pubs.push_back(std::make_unique<Pub>(url, *clients.back(), options));
      pubs.back()->on_published([&](const publisher::Published&) {
        if (++acked == flags.updates) {
          std::lock_guard lock(m);
          done_at = Steady::now();
          cv.notify_all();
        }
      });
    }
    progress(label + ": draining " + std::to_string(flags.updates) +
             " updates with batches_in_flight=" + std::to_string(batches_in_flight));
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    const auto deadline = start + std::chrono::seconds(flags.timeout_s);
    for (auto& pub : pubs) pub->start();
    bool complete = false;
    {
      std::unique_lock lock(m);
      complete = cv.wait_until(lock, deadline, [&] { return acked.load() >= flags.updates; });
    }
    const double acked_s =
        complete ? std::chrono::duration<double>(done_at - start).count() : seconds_since(start);
    // The deletes follow in groups; the drain is over when the outbox is empty.
    std::optional<double> empty_s;
    if (complete) {
      pqxx::connection c(url);
      while (Steady::now() < deadline) {
        if (pqxx::nontransaction(c)
                .exec("SELECT count(*) FROM events.outbox")[0][0]
                .as<int64_t>() == 0) {
          empty_s = seconds_since(start);
          break;
        }
        std::this_thread::sleep_for(2ms);
      }
    }
    const Cpu cpu = sample_cpu() - cpu0;
    uint64_t claims_made = 0, claimed_rows = 0, publish_errors = 0;
    std::string per_replica;
    for (auto& pub : pubs) {
      pub->stop();
      claims_made += pub->stats().claims.load();
      claimed_rows += pub->stats().claimed_updates.load();
      publish_errors += pub->stats().publish_errors.load();
      per_replica += (per_replica.empty() ? "" : " / ") +
                     thousands(static_cast<double>(pub->stats().published.load()));
    }
    pubs.clear();  // closes the connections: the backends flush their function statistics on exit
    std::this_thread::sleep_for(300ms);
    const uint64_t stored = client.stream_state(app).messages;
    const ClaimStats claims = claim_stats(url);
    client.delete_stream(app);

    Row r;
    r.label = label;
    r.what = what;
    r.updates = acked.load();
    r.seconds = acked_s;
    r.rate = r.updates / acked_s;
    r.cpu = cpu_text(cpu);
    r.ok = complete;
    std::ostringstream n;
    if (!complete) n << "TIMEOUT after " << flags.timeout_s << " s; ";
    n << "outbox empty after " << (empty_s ? fixed(*empty_s, 2) + " s" : std::string("(not empty)"))
      << "; " << claims_made << (claim == Claim::legacy ? " claims (" : " reads (")
      << fixed(claimed_rows / std::max<double>(1, claims_made), 1) << " rows each)";
    if (claim == Claim::legacy) {
      n << ", legacy.claim " << fixed(claims.total_ms / 1000.0, 2) << " s in total ("
        << fixed(claims.total_ms / std::max<int64_t>(1, claims.calls), 2) << " ms each)";
    }
    if (replicas > 1) n << "; published per replica " << per_replica;
    n << "; publish errors " << publish_errors << "; stream holds " << stored << "; prefill "
      << fixed(fill_s, 1) << " s";
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    return failed_row(label, what, e.what());
  }
}

Row outlive_phase(Services& s, const Flags& flags, const std::string& label, const std::string& app,
                  int batches_in_flight, Statistics statistics = Statistics::fresh,
                  int replicas = 1) {
  return drain_phase<publisher::Publisher>(s, flags, label, app, batches_in_flight, statistics,
                                           replicas, Claim::partitions);
}

// ---------------------------------------------------------------------------------------------
// (2) raw nats.c: the same messages, js_PublishMsgAsync then js_PublishAsyncComplete

struct RawNatsErrors {
  std::atomic<int64_t> count{0};
  std::mutex m;
  std::string first;
};

void raw_err_handler(jsCtx*, jsPubAckErr* err, void* closure) {
  auto* errors = static_cast<RawNatsErrors*>(closure);
  if (errors->count++ == 0) {
    std::lock_guard lock(errors->m);
    errors->first = err->ErrText != nullptr ? err->ErrText : natsStatus_GetText(err->Err);
  }
}

void nats_check(natsStatus s, const std::string& what) {
  if (s != NATS_OK) throw std::runtime_error(what + ": " + natsStatus_GetText(s));
}

Row raw_nats_phase(Services& s, const Flags& flags, const std::string& label,
                   const std::string& app, bool send_asap) {
  const std::string what =
      std::string("raw nats.c js_PublishMsgAsync + js_PublishAsyncComplete (no Postgres)") +
      (send_asap ? ", connection with SendAsap like topic::Client"
                 : ", default connection options");
  natsConnection* conn = nullptr;
  jsCtx* js = nullptr;
  try {
    // The same envelopes and ids as a pre-filled outbox, read once before timing.
    const std::string url = s.fresh_database();
    prefill(url, app, flags);
    const std::vector<Message> messages = outbox_messages(url);
    {
      topic::Client setup({s.nats.url()}, "publisher-bench-setup");
      setup.ensure_stream(app, topic::StreamSettings{});  // the same stream configuration
    }
    natsOptions* opts = nullptr;
    nats_check(natsOptions_Create(&opts), "nats options");
    natsOptions_SetURL(opts, s.nats.url().c_str());
    if (send_asap) natsOptions_SetSendAsap(opts, true);
    const natsStatus cs = natsConnection_Connect(&conn, opts);
    natsOptions_Destroy(opts);
    nats_check(cs, "connect");
    RawNatsErrors errors;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = 1 << 16;  // as topic::Client
    jo.PublishAsync.ErrHandler = &raw_err_handler;
    jo.PublishAsync.ErrHandlerClosure = &errors;
    nats_check(natsConnection_JetStream(&js, conn, &jo), "jetstream");
    const std::string subject = topic::subject_for(app);

    progress(label + ": publishing " + std::to_string(messages.size()) +
             " messages with raw nats.c" + (send_asap ? " (SendAsap)" : ""));
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 5000;
    int64_t sent = 0;
    for (const auto& msg : messages) {
      natsMsg* m = nullptr;
      nats_check(natsMsg_Create(&m, subject.c_str(), nullptr, msg.envelope.data(),
                                static_cast<int>(msg.envelope.size())),
                 "message");
      natsMsgHeader_Set(m, "Nats-Msg-Id", msg.id.c_str());
      natsMsgHeader_Set(m, "Outlive-Created-At", msg.created_at_us.c_str());
      const natsStatus ps = js_PublishMsgAsync(js, &m, &po);
      natsMsg_Destroy(m);
      nats_check(ps, "js_PublishMsgAsync");
      ++sent;
      if ((sent & 1023) == 0 && seconds_since(start) > flags.timeout_s) break;
    }
    jsPubOptions co;
    jsPubOptions_Init(&co);
    const double left_s = flags.timeout_s - seconds_since(start);
    co.MaxWait = std::max<int64_t>(1000, static_cast<int64_t>(left_s * 1000));
    const natsStatus complete = js_PublishAsyncComplete(js, &co);
    const double took = seconds_since(start);
    const Cpu cpu = sample_cpu() - cpu0;

    jsCtx_Destroy(js);
    js = nullptr;
    natsConnection_Destroy(conn);
    conn = nullptr;
    topic::Client check({s.nats.url()}, "publisher-bench-check");
    const uint64_t stored = check.stream_state(app).messages;
    check.delete_stream(app);

    Row r;
    r.label = label;
    r.what = what;
    r.updates = sent - errors.count.load();
    r.seconds = took;
    r.rate = r.updates / took;
    r.cpu = cpu_text(cpu);
    r.ok = complete == NATS_OK && errors.count.load() == 0 &&
           sent == static_cast<int64_t>(messages.size());
    std::ostringstream n;
    if (complete != NATS_OK)
      n << "js_PublishAsyncComplete: " << natsStatus_GetText(complete) << "; ";
    if (errors.count.load() != 0)
      n << errors.count.load() << " errors, first: " << errors.first << "; ";
    n << "stream holds " << stored
      << "; headers Nats-Msg-Id + Outlive-Created-At, MaxPending 65536";
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    if (js != nullptr) jsCtx_Destroy(js);
    if (conn != nullptr) natsConnection_Destroy(conn);
    return failed_row(label, what, e.what());
  }
}

// (2b) The same through outlive's topic::Client::publish_async, pipelined with no ordering: what
// the client layer (its pending map, per-message ack callback, SendAsap connection) costs by
// itself.
Row client_pipelined_phase(Services& s, const Flags& flags, const std::string& label,
                           const std::string& app) {
  const std::string what =
      "topic::Client::publish_async, all pipelined, no per-key order (no Postgres)";
  try {
    const std::string url = s.fresh_database();
    prefill(url, app, flags);
    const std::vector<Message> messages = outbox_messages(url);
    topic::Client client({s.nats.url()}, "publisher-bench");
    client.ensure_stream(app, topic::StreamSettings{});
    std::mutex m;
    std::condition_variable cv;
    std::atomic<int64_t> acked{0}, failed{0};
    const int64_t total = static_cast<int64_t>(messages.size());
    client.set_publish_handler([&](const topic::PublishResult& r) {
      (r.ok ? acked : failed)++;
      if (acked.load() + failed.load() == total) {
        std::lock_guard lock(m);
        cv.notify_all();
      }
    });
    const std::string subject = topic::subject_for(app);
    progress(label + ": publishing " + std::to_string(total) + " messages through topic::Client");
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    const auto deadline = start + std::chrono::seconds(flags.timeout_s);
    int64_t refused = 0;
    uint64_t token = 0;
    for (const auto& msg : messages) {
      if (client.publish_async(subject, msg.envelope, msg.id, ++token, 5000ms,
                               {{"Outlive-Created-At", msg.created_at_us}})) {
        ++refused;
      }
    }
    bool complete = false;
    {
      std::unique_lock lock(m);
      complete = cv.wait_until(lock, deadline,
                               [&] { return acked.load() + failed.load() + refused >= total; });
    }
    const double took = seconds_since(start);
    const Cpu cpu = sample_cpu() - cpu0;
    client.set_publish_handler(nullptr);
    const uint64_t stored = client.stream_state(app).messages;
    client.delete_stream(app);
    Row r;
    r.label = label;
    r.what = what;
    r.updates = acked.load();
    r.seconds = took;
    r.rate = r.updates / took;
    r.cpu = cpu_text(cpu);
    r.ok = complete && failed.load() == 0 && refused == 0;
    std::ostringstream n;
    if (!complete) n << "TIMEOUT; ";
    n << "failed " << failed.load() << ", refused " << refused << "; stream holds " << stored;
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    return failed_row(label, what, e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// (3) Postgres only: events.claim in batches of 100, then DELETE of the claimed positions

Row legacy_postgres_phase(Services& s, const Flags& flags, const std::string& label,
                          const std::string& app) {
  const std::string what =
      "Postgres only, today's claim: legacy.claim(100) then DELETE of the claimed positions (no "
      "NATS)";
  try {
    const std::string url = s.fresh_database();
    legacy_claim::install(url);
    const double fill_s = prefill(url, app, flags);
    pqxx::connection c(url);
    set_timeout(c, flags.timeout_s);
    const publisher::Options defaults;
    const std::string apps = "{" + app + "}";
    const std::string lease = std::to_string(defaults.lease.count()) + " milliseconds";
    progress(label + ": claim-and-delete of " + std::to_string(flags.updates) + " rows");
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    int64_t done = 0, claims = 0;
    bool timed_out = false;
    for (;;) {
      if (seconds_since(start) > flags.timeout_s) {
        timed_out = true;
        break;
      }
      // The publisher's claim statement, column for column.
      const auto result = pqxx::nontransaction(c).exec_params(
          "SELECT position, id::text, app_id, key, envelope,"
          " (extract(epoch FROM created_at) * 1000000)::bigint, attempts"
          " FROM legacy.claim($1, $2::text[], $3, $4::interval)",
          std::string("bench"), apps, defaults.claim_size, lease);
      ++claims;
      if (result.empty()) break;
      std::vector<int64_t> positions;
      positions.reserve(result.size());
      for (const auto& row : result) positions.push_back(row[0].as<int64_t>());
      pqxx::nontransaction(c).exec_params(
          "DELETE FROM events.outbox WHERE position = ANY($1::bigint[])", pg_array(positions));
      done += static_cast<int64_t>(positions.size());
    }
    const double took = seconds_since(start);
    const Cpu cpu = sample_cpu() - cpu0;
    const int64_t left = outbox_rows(url);
    Row r;
    r.label = label;
    r.what = what;
    r.updates = done;
    r.seconds = took;
    r.rate = done / took;
    r.cpu = cpu_text(cpu);
    r.ok = !timed_out && left == 0 && done == flags.updates;
    std::ostringstream n;
    if (timed_out) n << "TIMEOUT after " << flags.timeout_s << " s; ";
    n << claims << " claims, " << fixed(took * 1000.0 / std::max<int64_t>(1, claims), 2)
      << " ms per claim + delete; rows left " << left << "; prefill " << fixed(fill_s, 1) << " s";
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    return failed_row(label, what, e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// (3) Postgres only, the new claim: exactly the publisher's statements (outbox::PartitionStore):
// own all 64 partitions, read 100 by position behind the horizon, delete what was read.

Row postgres_phase(Services& s, const Flags& flags, const std::string& label,
                   const std::string& app) {
  const std::string what =
      "Postgres only, partitions: PartitionStore::read(100) by position, then settle (DELETE) of "
      "the rows read (no NATS)";
  try {
    const std::string url = s.fresh_database();
    const double fill_s = prefill(url, app, flags);
    outbox::PartitionStore store(url);
    store.join(app);
    std::vector<int> all(outbox::kPartitions);
    for (int p = 0; p < outbox::kPartitions; ++p) all[p] = p;
    const std::vector<int> owned = store.try_acquire(app, all);
    if (owned.size() != all.size()) throw std::runtime_error("could not own every partition");
    const int claim_size = publisher::Options{}.claim_size;
    progress(label + ": read-and-delete of " + std::to_string(flags.updates) + " rows");
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    publisher::Horizon horizon;
    int64_t done = 0, reads = 0;
    bool timed_out = false;
    for (;;) {
      if (seconds_since(start) > flags.timeout_s) {
        timed_out = true;
        break;
      }
      const auto result = store.read(app, horizon.cursor(), owned, {}, {}, claim_size);
      ++reads;
      const bool full = static_cast<int>(result.rows.size()) >= claim_size;
      horizon.advance(result, result.rows.empty() ? 0 : result.rows.back().position, full);
      if (result.rows.empty()) break;
      std::vector<int64_t> positions;
      positions.reserve(result.rows.size());
      for (const auto& row : result.rows) positions.push_back(row.position);
      store.settle(positions, {});
      done += static_cast<int64_t>(positions.size());
    }
    const double took = seconds_since(start);
    const Cpu cpu = sample_cpu() - cpu0;
    const int64_t left = outbox_rows(url);
    Row r;
    r.label = label;
    r.what = what;
    r.updates = done;
    r.seconds = took;
    r.rate = done / took;
    r.cpu = cpu_text(cpu);
    r.ok = !timed_out && left == 0 && done == flags.updates;
    std::ostringstream n;
    if (timed_out) n << "TIMEOUT after " << flags.timeout_s << " s; ";
    n << reads << " reads, " << fixed(took * 1000.0 / std::max<int64_t>(1, reads), 2)
      << " ms per read + delete; rows left " << left << "; prefill " << fixed(fill_s, 1) << " s";
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    return failed_row(label, what, e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// (3N) Postgres and NATS together, the least work a drain needs: the publisher's read by position
// (all 64 partitions owned), every row handed to raw nats.c (js_PublishMsgAsync, default connection
// options, as (2)) as soon as it is read, with no order per key (a key may have many in flight),
// the publisher's bound on rows held (batches_in_flight x 100), and acked positions deleted by
// publisher::Settler on its own connection and thread. (2) and (3) each have the machine to
// themselves; a drain needs both on the same cores at once, which is what this measures.

struct CombinedFloor {
  std::mutex m;
  std::condition_variable cv;
  std::unordered_map<std::string, int64_t> position_of;  // Nats-Msg-Id -> position
  std::vector<int64_t> acked_positions;                  // not handed to the settler yet
  int64_t acked = 0, failed = 0, deleted = 0;
};

void combined_floor_ack(jsCtx*, natsMsg* msg, jsPubAck*, jsPubAckErr* pae, void* closure) {
  auto* f = static_cast<CombinedFloor*>(closure);
  const char* id = nullptr;
  natsMsgHeader_Get(msg, "Nats-Msg-Id", &id);
  {
    std::lock_guard lock(f->m);
    auto it = id ? f->position_of.find(id) : f->position_of.end();
    if (it != f->position_of.end()) {
      if (pae == nullptr) {
        ++f->acked;
        f->acked_positions.push_back(it->second);
      } else {
        ++f->failed;
      }
      f->position_of.erase(it);
    }
  }
  f->cv.notify_all();
  natsMsg_Destroy(msg);
}

Row combined_floor_phase(Services& s, const Flags& flags, const std::string& label,
                         const std::string& app) {
  const std::string what =
      "Postgres and NATS together, least work: PartitionStore::read(100) by position, each row "
      "published at once with raw nats.c (default options, no per-key order), acked rows deleted "
      "by the Settler";
  CombinedFloor f;  // outlives js: acks may still arrive while an error unwinds
  natsConnection* conn = nullptr;
  jsCtx* js = nullptr;
  try {
    const std::string url = s.fresh_database();
    const double fill_s = prefill(url, app, flags);
    outbox::PartitionStore store(url);
    store.join(app);
    std::vector<int> all(outbox::kPartitions);
    for (int p = 0; p < outbox::kPartitions; ++p) all[p] = p;
    const std::vector<int> owned = store.try_acquire(app, all);
    if (owned.size() != all.size()) throw std::runtime_error("could not own every partition");
    {
      topic::Client setup({s.nats.url()}, "publisher-bench-setup");
      setup.ensure_stream(app, topic::StreamSettings{});
    }
    natsOptions* opts = nullptr;
    nats_check(natsOptions_Create(&opts), "nats options");
    natsOptions_SetURL(opts, s.nats.url().c_str());
    const natsStatus cs = natsConnection_Connect(&conn, opts);
    natsOptions_Destroy(opts);
    nats_check(cs, "connect");
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = 1 << 16;
    jo.PublishAsync.AckHandler = &combined_floor_ack;
    jo.PublishAsync.AckHandlerClosure = &f;
    nats_check(natsConnection_JetStream(&js, conn, &jo), "jetstream");
    const int claim_size = publisher::Options{}.claim_size;
    const int max_held = flags.batches_in_flight * claim_size;
    publisher::Settler settler(url, [&](std::vector<int64_t> positions) {
      {
        std::lock_guard lock(f.m);
        f.deleted += static_cast<int64_t>(positions.size());
      }
      f.cv.notify_all();
    });
    const std::string subject = topic::subject_for(app);
    progress(label + ": read, publish and delete " + std::to_string(flags.updates) + " rows");
    const Cpu cpu0 = sample_cpu();
    const auto start = Steady::now();
    const auto deadline = start + std::chrono::seconds(flags.timeout_s);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 5000;
    publisher::Horizon horizon;
    int64_t sent = 0, reads = 0;
    bool timed_out = false;
    for (;;) {
      std::vector<int64_t> to_delete;
      bool read_more = false;
      {
        std::unique_lock lock(f.m);
        const auto all_sent = [&] { return sent >= flags.updates; };
        const auto room = [&] { return sent - (f.acked + f.failed) <= max_held - claim_size; };
        // Acks to hand to the settler, room for a read, or (all sent) every ack in.
        if (!f.cv.wait_until(lock, deadline, [&] {
              return !f.acked_positions.empty() ||
                     (all_sent() ? f.acked + f.failed >= sent : room());
            })) {
          timed_out = true;
          break;
        }
        to_delete.swap(f.acked_positions);
        read_more = !all_sent() && room();
        if (all_sent() && f.acked + f.failed >= sent) {
          lock.unlock();
          if (!to_delete.empty()) settler.add(std::move(to_delete));
          break;
        }
      }
      if (!to_delete.empty()) settler.add(std::move(to_delete));
      if (!read_more) continue;
      auto result = store.read(app, horizon.cursor(), owned, {}, {}, claim_size);
      ++reads;
      const bool full = static_cast<int>(result.rows.size()) >= claim_size;
      horizon.advance(result, result.rows.empty() ? 0 : result.rows.back().position, full);
      for (const auto& row : result.rows) {
        {
          std::lock_guard lock(f.m);
          f.position_of.emplace(row.id, row.position);
        }
        natsMsg* msg = nullptr;
        nats_check(natsMsg_Create(&msg, subject.c_str(), nullptr, row.envelope.data(),
                                  static_cast<int>(row.envelope.size())),
                   "message");
        natsMsgHeader_Set(msg, "Nats-Msg-Id", row.id.c_str());
        natsMsgHeader_Set(msg, "Outlive-Created-At", std::to_string(row.created_at_us).c_str());
        const natsStatus ps = js_PublishMsgAsync(js, &msg, &po);
        natsMsg_Destroy(msg);
        nats_check(ps, "js_PublishMsgAsync");
        ++sent;
      }
      if (result.rows.empty()) std::this_thread::sleep_for(1ms);
    }
    const double acked_s = seconds_since(start);
    int64_t acked = 0, failed = 0;
    {
      std::unique_lock lock(f.m);
      f.cv.wait_until(lock, deadline, [&] { return f.deleted >= f.acked; });
      acked = f.acked;
      failed = f.failed;
    }
    const double empty_s = seconds_since(start);
    const Cpu cpu = sample_cpu() - cpu0;
    jsCtx_Destroy(js);
    js = nullptr;
    natsConnection_Destroy(conn);
    conn = nullptr;
    topic::Client check({s.nats.url()}, "publisher-bench-check");
    const uint64_t stored = check.stream_state(app).messages;
    check.delete_stream(app);
    const int64_t left = outbox_rows(url);
    Row r;
    r.label = label;
    r.what = what;
    r.updates = acked;
    r.seconds = acked_s;
    r.rate = acked / acked_s;
    r.cpu = cpu_text(cpu);
    r.ok = !timed_out && failed == 0 && acked == flags.updates;
    std::ostringstream n;
    if (timed_out) n << "TIMEOUT after " << flags.timeout_s << " s; ";
    n << "outbox empty after " << fixed(empty_s, 2) << " s (rows left " << left << "); " << reads
      << " reads; publish errors " << failed << "; stream holds " << stored << "; prefill "
      << fixed(fill_s, 1) << " s";
    r.notes = n.str();
    progress(label + ": " + thousands(r.rate) + " updates/s; " + r.notes);
    return r;
  } catch (const std::exception& e) {
    if (js != nullptr) jsCtx_Destroy(js);
    if (conn != nullptr) natsConnection_Destroy(conn);
    return failed_row(label, what, e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// (5) Commit-to-ack latency with writers committing at a fixed rate while the Publisher runs

struct LatencyResult {
  Row row;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double target_rate = 0, achieved_rate = 0;
  int64_t count = 0;
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

// (5F) The floor of commit-to-ack: what any claim must do per update and nothing more. The wake's
// notification arrives on the LISTEN thread, which at once takes the app's pending rows in one
// round trip (DELETE ... RETURNING: no order per key, no crash safety) and publishes each through
// the same topic::Client; the ack is the end. Same interface as the publishers, for latency_phase.
class FloorClaim {
 public:
  FloorClaim(std::string url, topic::Client& nats, publisher::Options options,
             const Clock& = SteadyClock::instance())
      : url_(std::move(url)),
        nats_(nats),
        app_(options.apps.at(0)),
        timeout_(options.publish_timeout) {}
  ~FloorClaim() { stop(); }
  void on_published(std::function<void(const publisher::Published&)> callback) {
    on_published_ = std::move(callback);
  }
  const publisher::Stats& stats() const { return stats_; }
  void start() {
    conn_ = std::make_unique<pqxx::connection>(url_);
    conn_->prepare("take",
                   "DELETE FROM events.outbox WHERE app_id = $1 RETURNING id::text, key,"
                   " envelope::text, (extract(epoch FROM created_at) * 1000000)::bigint");
    nats_.set_publish_handler([this](const topic::PublishResult& r) {
      Sent sent;
      {
        std::lock_guard lock(mutex_);
        auto it = sent_.find(r.token);
        if (it == sent_.end()) return;
        sent = it->second;
        sent_.erase(it);
      }
      if (!r.ok) return void(stats_.publish_errors++);
      stats_.published++;
      if (on_published_) {
        on_published_(publisher::Published{
            app_, "", r.sequence,
            std::chrono::system_clock::time_point(std::chrono::microseconds(sent.created_us)),
            r.acked_at, sent.read_at, sent.sent_at});
      }
    });
    // The floor's listener: a thread of its own that takes the rows as soon as a wake arrives.
    wake_ = std::make_unique<outbox::WakeConnection>(url_);
    listening_ = true;
    listener_ = std::thread([this] {
      while (listening_) {
        pollfd p{wake_->socket(), POLLIN, 0};
        if (::poll(&p, 1, 200) <= 0) continue;
        for (const auto& app : wake_->take()) {
          if (app == app_) take();
        }
      }
    });
    take();  // what was there before the listener
  }
  void stop() {
    listening_ = false;
    if (listener_.joinable()) listener_.join();
    wake_.reset();
    nats_.set_publish_handler(nullptr);
    conn_.reset();
  }

 private:
  void take() {
    std::lock_guard running(take_mutex_);
    const auto rows = pqxx::nontransaction(*conn_).exec_prepared("take", app_);
    const auto read_at = std::chrono::system_clock::now();
    stats_.claims++;
    for (const auto& row : rows) {
      const uint64_t token = ++next_token_;
      {
        std::lock_guard lock(mutex_);
        sent_[token] = Sent{row[3].as<int64_t>(), read_at, std::chrono::system_clock::now()};
      }
      const auto error = nats_.publish_async(topic::subject_for(app_), row[2].as<std::string>(),
                                             row[0].as<std::string>(), token, timeout_);
      if (error) stats_.publish_errors++;
    }
  }

  const std::string url_;
  topic::Client& nats_;
  const std::string app_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<pqxx::connection> conn_;
  std::mutex take_mutex_, mutex_;
  struct Sent {
    int64_t created_us = 0;
    std::chrono::system_clock::time_point read_at, sent_at;
  };
  std::map<uint64_t, Sent> sent_;
  std::atomic<uint64_t> next_token_{0};
  publisher::Stats stats_;
  std::function<void(const publisher::Published&)> on_published_;
  std::unique_ptr<outbox::WakeConnection> wake_;
  std::atomic<bool> listening_{false};
  std::thread listener_;
};

template <typename P>
LatencyResult latency_phase(Services& s, const Flags& flags, const std::string& label,
                            const std::string& app, double rate, const std::string& rate_source,
                            Claim claim) {
  LatencyResult out;
  out.target_rate = rate;
  const int64_t count = std::max<int64_t>(1, static_cast<int64_t>(rate * flags.latency_seconds));
  out.count = count;
  const std::string what = "commit-to-ack latency (acked_at - created_at) at " + thousands(rate) +
                           " updates/s = " + rate_source + ", " + std::to_string(flags.writers) +
                           " writers, single-update commits + events.wake" +
                           (claim == Claim::legacy  ? ", today's lease claim"
                            : claim == Claim::floor ? ", the floor: the wake's listener takes the"
                                                      " rows in one round trip and publishes them"
                                                      " (no order per key, no crash safety)"
                                                    : "");
  try {
    const std::string url = s.fresh_database();
    if (claim == Claim::legacy) legacy_claim::install(url);
    topic::Client client({s.nats.url()}, "publisher-bench");
    client.ensure_stream(app, topic::StreamSettings{});
    publisher::Options options;
    options.apps = {app};
    options.batches_in_flight = flags.batches_in_flight;
    auto pub = std::make_unique<P>(url, client, options);
    std::mutex m;
    std::condition_variable cv;
    std::vector<double> latencies_ms;
    // The stages of each update, when the claim reports them: commit to read, read to the
    // hand-off to NATS, hand-off to ack.
    std::vector<double> to_read_ms, to_send_ms, to_ack_ms;
    std::vector<std::chrono::system_clock::time_point> created;
    latencies_ms.reserve(static_cast<size_t>(count));
    created.reserve(static_cast<size_t>(count));
    pub->on_published([&](const publisher::Published& p) {
      const double ms =
          std::chrono::duration<double, std::milli>(p.acked_at - p.created_at).count();
      using Ms = std::chrono::duration<double, std::milli>;
      std::lock_guard lock(m);
      latencies_ms.push_back(ms);
      created.push_back(p.created_at);
      if (p.read_at != std::chrono::system_clock::time_point{}) {
        to_read_ms.push_back(Ms(p.read_at - p.created_at).count());
        to_send_ms.push_back(Ms(p.sent_at - p.read_at).count());
        to_ack_ms.push_back(Ms(p.acked_at - p.sent_at).count());
      }
      if (static_cast<int64_t>(latencies_ms.size()) == count) cv.notify_all();
    });
    const Cpu cpu0 = sample_cpu();
    pub->start();
    const auto ready_deadline = Steady::now() + 10s;
    while (pub->stats().claims.load() < 1 && Steady::now() < ready_deadline)
      std::this_thread::sleep_for(1ms);

    progress(label + ": " + std::to_string(flags.writers) + " writers commit " +
             std::to_string(count) + " updates at " + thousands(rate) + "/s");
    std::atomic<int64_t> committed{0}, write_errors{0};
    std::atomic<bool> abandon{false};
    std::vector<Steady::time_point> finished(static_cast<size_t>(flags.writers));
    std::vector<double> max_behind_ms(static_cast<size_t>(flags.writers), 0.0);
    const auto t0 = Steady::now() + 50ms;
    const auto t0_system = std::chrono::system_clock::now() + 50ms;
    std::vector<std::thread> writers;
    for (int w = 0; w < flags.writers; ++w) {
      writers.emplace_back([&, w] {
        try {
          pqxx::connection c(url);
          set_timeout(c, flags.timeout_s);
          for (int64_t j = w; j < count && !abandon; j += flags.writers) {
            const auto due = t0 + std::chrono::duration_cast<Steady::duration>(
                                      std::chrono::duration<double>(static_cast<double>(j) / rate));
            std::this_thread::sleep_until(due);
            auto& behind = max_behind_ms[static_cast<size_t>(w)];
            behind = std::max(
                behind, std::chrono::duration<double, std::milli>(Steady::now() - due).count());
            const std::string key = "k" + std::to_string(j % flags.keys);
            // One round trip: the update commits on its own, then wakes the replicas.
            pqxx::nontransaction(c).exec("BEGIN; SELECT events.publish_live('" + app + "', '" +
                                         key + "', jsonb_build_object('n', " + std::to_string(j) +
                                         ")); COMMIT; SELECT events.wake('" + app + "')");
            committed++;
          }
        } catch (const std::exception& e) {
          write_errors++;
          std::cerr << "writer " << w << ": " << e.what() << "\n";
        }
        finished[static_cast<size_t>(w)] = Steady::now();
      });
    }
    const auto deadline = t0 + std::chrono::seconds(flags.timeout_s);
    bool complete = false;
    {
      std::unique_lock lock(m);
      complete = cv.wait_until(lock, deadline,
                               [&] { return static_cast<int64_t>(latencies_ms.size()) >= count; });
    }
    abandon = true;
    for (auto& t : writers) t.join();
    const auto last_commit = *std::max_element(finished.begin(), finished.end());
    const double write_s = std::chrono::duration<double>(last_commit - t0).count();
    pub->stop();
    const Cpu cpu = sample_cpu() - cpu0;
    const uint64_t claims_made = pub->stats().claims.load();
    pub.reset();
    std::this_thread::sleep_for(300ms);
    client.delete_stream(app);

    std::vector<double> lat;
    std::vector<std::chrono::system_clock::time_point> created_at;
    {
      std::lock_guard lock(m);
      lat = latencies_ms;
      created_at = created;
    }
    // Per second of commits (stderr): is a tail spread out, or one stall?
    {
      std::map<int, std::vector<double>> by_second;
      for (size_t i = 0; i < lat.size(); ++i) {
        const int sec = static_cast<int>(
            std::floor(std::chrono::duration<double>(created_at[i] - t0_system).count()));
        by_second[sec].push_back(lat[i]);
      }
      for (auto& [sec, v] : by_second) {
        const double mx = *std::max_element(v.begin(), v.end());
        progress(label + ": second " + std::to_string(sec) + ": " + std::to_string(v.size()) +
                 " updates, p50 " + fixed(percentile(v, 0.5), 1) + " ms, p99 " +
                 fixed(percentile(v, 0.99), 1) + " ms, max " + fixed(mx, 1) + " ms");
      }
    }
    out.achieved_rate = committed.load() / write_s;
    out.p50_ms = percentile(lat, 0.50);
    out.p99_ms = percentile(lat, 0.99);
    out.max_ms = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
    Row& r = out.row;
    r.label = label;
    r.what = what;
    r.updates = static_cast<int64_t>(lat.size());
    r.seconds = write_s;
    r.rate = out.achieved_rate;
    r.cpu = cpu_text(cpu);
    r.ok = complete && write_errors.load() == 0;
    std::ostringstream n;
    if (!complete) n << "INCOMPLETE: " << lat.size() << " of " << count << " acked; ";
    n << "**p50 " << fixed(out.p50_ms, 2) << " ms, p99 " << fixed(out.p99_ms, 2) << " ms**, max "
      << fixed(out.max_ms, 2) << " ms; writers committed " << committed.load() << " at "
      << thousands(out.achieved_rate) << "/s (target " << thousands(rate)
      << "/s, a writer fell up to "
      << fixed(*std::max_element(max_behind_ms.begin(), max_behind_ms.end()), 0)
      << " ms behind its schedule); " << claims_made
      << (claim == Claim::partitions ? " reads" : " claims");
    if (write_errors.load() != 0) n << "; " << write_errors.load() << " writer errors";
    {
      std::lock_guard lock(m);
      if (!to_read_ms.empty()) {
        const auto stage = [&](const char* name, std::vector<double>& v) {
          const double mx = *std::max_element(v.begin(), v.end());
          n << "; " << name << " p50 " << fixed(percentile(v, 0.5), 2) << " / p99 "
            << fixed(percentile(v, 0.99), 2) << " / max " << fixed(mx, 2) << " ms";
        };
        stage("commit to read", to_read_ms);
        stage("read to send", to_send_ms);
        stage("send to ack", to_ack_ms);
      }
    }
    r.notes = n.str();
    progress(label + ": " + r.notes);
    return out;
  } catch (const std::exception& e) {
    out.row = failed_row(label, what, e.what());
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// Report

void print_row(const Row& r) {
  std::cout << "| " << r.label << " | " << r.what << " | "
            << (r.updates ? thousands(static_cast<double>(r.updates)) : "-") << " | "
            << (r.seconds > 0 ? fixed(r.seconds, 2) : "-") << " | "
            << (r.rate > 0 ? "**" + thousands(r.rate) + "**" : "-") << " | "
            << (r.cpu.empty() ? "-" : r.cpu) << " | " << r.notes << " |\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  log::set_min_level(log::Level::warn);

  // Bounded in time whatever happens: every phase stops itself after --timeout; this is the
  // backstop (the servers are our children and die with us).
  const int phases =
      (11 + static_cast<int>(flags.extra_batches_in_flight.size())) * flags.repeat + 1;
  std::thread([limit = std::chrono::seconds(flags.timeout_s * (phases + 1) + 120)] {
    std::this_thread::sleep_for(limit);
    std::cerr << "publisher_bench: overall time limit of " << limit.count()
              << " s passed, exiting\n";
    std::_Exit(3);
  }).detach();

  const auto started = Steady::now();
  progress("starting PostgreSQL 15 and nats-server on loopback");
  Services s(flags);
  const std::string pg_version = [&] {
    pqxx::connection c(s.postgres.url());
    return pqxx::nontransaction(c).exec("SHOW server_version")[0][0].as<std::string>();
  }();
  const std::string nats_version = command_output("nats-server --version 2>&1");
  const double load_before = load_average();

  int app_n = 0;
  auto next_app = [&] { return "bench" + std::to_string(++app_n); };

  // Phases 1-3 and the extra rows, each `--repeat` times, interleaved (1, 2, 3, 1, 2, 3, ...) so a
  // change in the machine's load hits them alike.
  struct Planned {
    std::string label;
    std::function<Row(const std::string& app)> run;
  };
  std::vector<Planned> plan;
  auto want = [&](const std::string& label) {
    return flags.only.empty() ||
           std::find(flags.only.begin(), flags.only.end(), label) != flags.only.end();
  };
  auto add = [&](const std::string& label, std::function<Row(const std::string& app)> run) {
    if (want(label)) plan.push_back(Planned{label, std::move(run)});
  };
  add("1", [&](const std::string& app) {
    return outlive_phase(s, flags, "1", app, flags.batches_in_flight);
  });
  add("2", [&](const std::string& app) { return raw_nats_phase(s, flags, "2", app, false); });
  add("3", [&](const std::string& app) { return postgres_phase(s, flags, "3", app); });
  add("3N", [&](const std::string& app) { return combined_floor_phase(s, flags, "3N", app); });
  add("1L", [&](const std::string& app) {
    return drain_phase<legacy_claim::Publisher>(s, flags, "1L", app, flags.batches_in_flight,
                                                Statistics::fresh, 1, Claim::legacy);
  });
  add("3L", [&](const std::string& app) { return legacy_postgres_phase(s, flags, "3L", app); });
  add("1r2", [&](const std::string& app) {
    return outlive_phase(s, flags, "1r2", app, flags.batches_in_flight, Statistics::fresh, 2);
  });
  char suffix = 'a';
  for (int b : flags.extra_batches_in_flight) {
    const std::string label = std::string("1") + suffix++;
    add(label,
        [&, label, b](const std::string& app) { return outlive_phase(s, flags, label, app, b); });
  }
  if (flags.extra_stale_stats) {
    add("1s", [&](const std::string& app) {
      return outlive_phase(s, flags, "1s", app, flags.batches_in_flight,
                           Statistics::of_empty_outbox);
    });
  }
  if (flags.extra_ceilings) {
    add("2a", [&](const std::string& app) { return raw_nats_phase(s, flags, "2a", app, true); });
    add("2b", [&](const std::string& app) { return client_pipelined_phase(s, flags, "2b", app); });
  }
  std::vector<std::vector<Row>> runs(plan.size());
  for (int r = 0; r < flags.repeat; ++r) {
    if (flags.repeat > 1)
      progress("round " + std::to_string(r + 1) + " of " + std::to_string(flags.repeat));
    for (size_t i = 0; i < plan.size(); ++i) {
      Row row = plan[i].run(next_app());
      row.notes += "; load average " + fixed(load_average(), 1);
      runs[i].push_back(std::move(row));
    }
  }
  std::vector<Row> rows, extra;
  auto runs_of = [&](const std::string& label) -> const std::vector<Row>* {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].label == label) return &runs[i];
    }
    return nullptr;
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    const bool main_row = plan[i].label == "1" || plan[i].label == "2" || plan[i].label == "3" ||
                          plan[i].label == "3N" || plan[i].label == "1L" || plan[i].label == "3L" ||
                          plan[i].label == "1r2";
    (main_row ? rows : extra).push_back(median_of(runs[i]));
  }
  const Row outlive = runs_of("1") ? median_of(*runs_of("1")) : Row{};

  LatencyResult latency, latency_legacy, latency_floor;
  const bool latency_wanted = want("5");
  const double latency_rate = flags.latency_rate > 0 ? flags.latency_rate : 0.5 * outlive.rate;
  if (latency_wanted && latency_rate > 0) {
    const std::string source =
        flags.latency_rate > 0 ? std::string("--latency-rate") : std::string("0.5 x (1)");
    latency = latency_phase<publisher::Publisher>(s, flags, "5", next_app(), latency_rate, source,
                                                  Claim::partitions);
    latency.row.notes += "; load average " + fixed(load_average(), 1);
    if (want("5F")) {
      latency_floor =
          latency_phase<FloorClaim>(s, flags, "5F", next_app(), latency_rate, source, Claim::floor);
      latency_floor.row.notes += "; load average " + fixed(load_average(), 1);
    }
    if (want("5L")) {
      latency_legacy = latency_phase<legacy_claim::Publisher>(s, flags, "5L", next_app(),
                                                              latency_rate, source, Claim::legacy);
      latency_legacy.row.notes += "; load average " + fixed(load_average(), 1);
    }
  } else if (latency_wanted) {
    latency.row = failed_row("5", "commit-to-ack latency", "no rate from (1)");
  }

  const double load_after = load_average();

  // ---- the table
  std::cout << "\n### publisher_bench, " << now_utc() << "\n\n";
  std::cout << "- Machine: " << std::thread::hardware_concurrency() << " CPUs (nproc "
            << command_output("nproc") << "), " << cpu_model() << ", kernel "
            << command_output("uname -r") << "\n";
  std::cout << "- Services (on the same machine, loopback): PostgreSQL " << pg_version
            << " (harness: fsync=off, synchronous_commit=off, full_page_writes=off, "
               "shared_buffers=128MB), "
            << nats_version << " (JetStream file storage, replicas 1)\n";
  if (flags.repeat > 1) {
    std::cout << "- Phases 1-3 and the extra rows ran " << flags.repeat
              << " times each, interleaved; each row shows its median run\n";
  }
  std::cout << "- Workload: " << thousands(flags.updates) << " updates over "
            << thousands(flags.keys) << " keys ('k' || (i % " << flags.keys
            << ")), envelopes {\"v\":1,\"k\":..,\"d\":{\"n\":i}}"
            << (flags.analyze ? ", VACUUM ANALYZE after the prefill"
                              : ", no ANALYZE after the prefill")
            << "; a fresh database and a fresh stream per phase\n";
  std::cout << "- Load average (1 min) before / after: " << fixed(load_before, 2) << " / "
            << fixed(load_after, 2) << "; total run " << fixed(seconds_since(started), 0) << " s\n";
  std::cout << "- Command: `cd build && cmake . && make publisher_bench && cd .. && "
            << flags.command << "`\n\n";
  std::cout << "| # | Measurement | updates | seconds | updates/s | CPU s bench / postgres / nats "
               "| Notes |\n";
  std::cout << "|---|---|---:|---:|---:|---|---|\n";
  for (const auto& r : rows) print_row(r);
  if (runs_of("1") && runs_of("2") && runs_of("3")) {
    const std::vector<Row>* phase[3] = {runs_of("1"), runs_of("2"), runs_of("3")};
    // Per round, from runs made minutes apart at most: a shared machine's load drifts, so the
    // ratio of one round's runs is fairer than a ratio of medians taken from different rounds.
    std::vector<double> ratios;
    std::string per_round;
    int lower_is_pg = 0;
    for (int r = 0; r < flags.repeat; ++r) {
      const double ceiling = std::min((*phase[1])[r].rate, (*phase[2])[r].rate);
      const bool ok = (*phase[0])[r].rate > 0 && ceiling > 0;
      if (ok) {
        ratios.push_back((*phase[0])[r].rate / ceiling);
        if ((*phase[2])[r].rate <= (*phase[1])[r].rate) lower_is_pg++;
      }
      per_round +=
          (r ? ", " : "") + (ok ? fixed((*phase[0])[r].rate / ceiling, 2) : std::string("failed"));
    }
    std::cout << "| 4 | ratio (1) / min((2), (3))"
              << (flags.repeat > 1 ? ", median of the rounds' ratios" : "") << " | | | ";
    if (static_cast<int>(ratios.size()) == flags.repeat) {
      std::sort(ratios.begin(), ratios.end());
      const double ratio = ratios[ratios.size() / 2];
      std::cout << "**" << fixed(ratio, 2)
                << "** | | target >= 0.8: " << (ratio >= 0.8 ? "met" : "NOT met")
                << "; the lower ceiling was (3) in " << lower_is_pg << " of " << flags.repeat
                << " rounds";
      if (flags.repeat > 1) std::cout << "; per round: " << per_round;
      std::cout << " |\n";
    } else {
      std::cout << "- | | not computable (a phase failed): " << per_round << " |\n";
    }
  }
  // Same-run ratios of issue 15: the new claim against today's, and two replicas against one.
  auto round_ratio = [&](const std::string& num, const std::string& den, const std::string& what,
                         double target, const std::string& target_text) {
    if (!runs_of(num) || !runs_of(den)) return;
    std::vector<double> ratios;
    std::string per_round;
    for (int r = 0; r < flags.repeat; ++r) {
      const double a = (*runs_of(num))[r].rate, b = (*runs_of(den))[r].rate;
      if (a > 0 && b > 0) ratios.push_back(a / b);
      per_round += (r ? ", " : "") + (a > 0 && b > 0 ? fixed(a / b, 2) : std::string("failed"));
    }
    if (static_cast<int>(ratios.size()) != flags.repeat) {
      std::cout << "| 4 | " << what << " | | | - | | not computable: " << per_round << " |\n";
      return;
    }
    std::sort(ratios.begin(), ratios.end());
    const double ratio = ratios[ratios.size() / 2];
    std::cout << "| 4 | " << what << " | | | **" << fixed(ratio, 2) << "** | | target "
              << target_text << ": " << (ratio >= target ? "met" : "NOT met")
              << (flags.repeat > 1 ? "; per round: " + per_round : std::string()) << " |\n";
  };
  round_ratio("1", "1L", "ratio (1) / (1L): partitions against today's lease claim", 2.0, ">= 2");
  round_ratio("1r2", "1", "ratio (1r2) / (1): two replicas against one", 1.0001, "> 1");
  round_ratio("3", "3L", "ratio (3) / (3L): the Postgres floors", 0, "(information)");
  round_ratio("1", "3N",
              "ratio (1) / (3N): against Postgres and NATS together doing the least a drain needs",
              0, "(information)");
  if (latency_wanted) print_row(latency.row);
  if (latency_wanted && want("5F")) print_row(latency_floor.row);
  if (latency_wanted && want("5L")) print_row(latency_legacy.row);
  for (const auto& r : extra) print_row(r);
  std::cout << "\nCPU columns: CPU seconds used during the timed part of the phase by this process "
               "(publisher,\n"
               "nats.c and writer threads), by the PostgreSQL server (all backends) and by "
               "nats-server; the\n"
               "machine has "
            << std::thread::hardware_concurrency() << " cores, i.e. "
            << std::thread::hardware_concurrency()
            << " CPU seconds per wall second for all three.\n";

  bool all_ok = !latency_wanted || latency.row.ok;
  for (const auto& r : rows) all_ok = all_ok && r.ok;
  for (const auto& r : extra) all_ok = all_ok && r.ok;
  return all_ok ? 0 : 1;
}
