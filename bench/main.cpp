// llmgw-bench: one subcommand per area; each prints medians and ratios
// measured side by side in one run.
#include "bench/bench.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace llmgw::bench {

void report(const std::string& name, double value, const std::string& unit,
            const std::string& note) {
  fmt::print("{:<52} {:>14.3f} {:<12} {}\n", name, value, unit, note);
}

} // namespace llmgw::bench

int main(int argc, char** argv) {
  CLI::App app{"llmgw-bench: throughput and latency of llmgw's parts"};
  app.require_subcommand(1);
  int rounds = 15;
  int exit_code = 0;
  auto* wire = app.add_subcommand("wire", "vLLM event decoding and block hashing");
  wire->add_option("--rounds", rounds, "timed rounds per measurement (median reported)")
    ->check(CLI::Range(3, 1000))
    ->capture_default_str();
  wire->callback([&] { exit_code = llmgw::bench::run_wire_bench(rounds); });
  auto* agent = app.add_subcommand("agent", "events to updates: decode, mirror, drain, serialize");
  agent->add_option("--rounds", rounds, "timed rounds per measurement (median reported)")
    ->check(CLI::Range(3, 1000))
    ->capture_default_str();
  agent->callback([&] { exit_code = llmgw::bench::run_agent_bench(rounds); });
  auto* actors =
    app.add_subcommand("agent-actors", "events through the subscriber and mirror actors");
  actors->add_option("--rounds", rounds, "timed rounds (median reported)")
    ->check(CLI::Range(3, 1000))
    ->capture_default_str();
  actors->callback([&] { exit_code = llmgw::bench::run_agent_actors_bench(rounds); });
  auto* router = app.add_subcommand("router", "decision latency, index updates and memory");
  router->add_option("--rounds", rounds, "rounds (x20 latency samples)")
    ->check(CLI::Range(3, 1000))
    ->capture_default_str();
  router->callback([&] { exit_code = llmgw::bench::run_router_bench(rounds); });
  double rate = 1000;
  auto* gw =
    app.add_subcommand("gateway", "the gateway's added latency beside the upstream and nginx");
  gw->add_option("--rounds", rounds, "interleaved rounds (median reported)")
    ->check(CLI::Range(1, 1000))
    ->capture_default_str();
  gw->add_option("--rate", rate, "open-loop requests per second")->capture_default_str();
  std::string only;
  gw->add_option("--only", only,
                 "run only the targets whose name contains this (to profile one; the upstream "
                 "always runs, as the baseline)");
  int prompt_tokens = 512;
  gw->add_option("--prompt-tokens", prompt_tokens,
                 "tokens per prompt (16: almost no routing work, the HTTP path alone)")
    ->check(CLI::Range(1, 1 << 20))
    ->capture_default_str();
  gw->callback(
    [&] { exit_code = llmgw::bench::run_gateway_bench(rounds, rate, only, prompt_tokens); });
  auto* routing = app.add_subcommand(
    "routing", "routing policies compared on local clusters of llmgw-sim engines");
  std::vector<std::string> scenarios{"a", "b", "c", "d", "e", "f"};
  std::vector<std::string> policies;
  std::uint64_t seed = 1;
  double time_scale = 4;
  double load = 1;
  routing->add_option("--scenarios", scenarios, "which of a..f")->capture_default_str();
  routing->add_option(
    "--policies", policies,
    "round-robin, least-outstanding, session-hash, llmgw-tier1, llmgw (default: these), "
    "llmgw-attached (llmgw with every engine started at vLLM's defaults and subscribed where it "
    "binds), llmgw-sglang (the same with every engine an SGLang: llmgw-sim --sim-as sglang)");
  routing->add_option("--seed", seed, "the workload's seed")->capture_default_str();
  routing
    ->add_option("--time-scale", time_scale,
                 "engine step times x this (slower sims keep two cores ahead of them)")
    ->check(CLI::Range(0.1, 100.0))
    ->capture_default_str();
  routing->add_option("--load", load, "session arrival rate x this")
    ->check(CLI::Range(0.01, 100.0))
    ->capture_default_str();
  bool no_engine_load = false;
  routing->add_flag("--no-engine-load", no_engine_load,
                    "the gateways ignore the engines' own load (engine_load_max_age_ms = 0), "
                    "for comparison");
  routing->callback([&] {
    exit_code =
      llmgw::bench::run_routing_bench(scenarios, policies, seed, time_scale, load, !no_engine_load);
  });
  auto* soak =
    app.add_subcommand("soak", "a local cluster under sustained block events and requests");
  double minutes = 10, events = 100000, requests = 10;
  soak->add_option("--minutes", minutes, "how long")
    ->check(CLI::Range(1.0, 1440.0))
    ->capture_default_str();
  soak->add_option("--events", events, "block events a second, all engines together")
    ->check(CLI::Range(0.0, 1e7))
    ->capture_default_str();
  soak->add_option("--rate", requests, "requests a second")
    ->check(CLI::Range(0.1, 10000.0))
    ->capture_default_str();
  soak->callback([&] { exit_code = llmgw::bench::run_soak_bench(minutes, events, requests); });
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
