// llmgw-sim: a stand-in for vLLM where there is no GPU (or, with --sim-as
// sglang, for SGLang's event stream, with --model-path and --page-size as
// SGLang names them). Started like vLLM
// (the flags below keep vLLM's names; PYTHONHASHSEED and
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES from the environment), it serves
// vLLM's HTTP API and publishes vLLM's KV event stream (apps/llmgw-sim/
// sim_engine.hpp). SIGTERM or SIGINT stop it.
//   llmgw-sim [serve] MODEL --port 8001 --kv-events-config '{...}' ...
#include "apps/common/memory.hpp"
#include "apps/common/stop_signals.hpp"
#include "apps/llmgw-sim/sim_engine.hpp"
#include "base/log.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <pthread.h>

namespace {

int run(int argc, char** argv) {
  using llmgw::sim::engine_options;
  engine_options o;
  std::vector<std::string> positional;
  std::vector<std::string> lora;
  std::string served_name;
  std::string shape = "map";
  std::size_t override_blocks = 0;
  CLI::App app{"llmgw-sim: a vLLM stand-in (HTTP API, KV cache, KV events), no GPU needed.\n"
               "Its defaults model Llama-3.1-8B in BF16 on one H100 SXM under vLLM V1; where\n"
               "each number comes from: docs/simulator.md"};
  app.add_option("positional", positional, "[serve] MODEL, as vLLM takes them");
  app.add_option("--model", o.model, "the model name to serve");
  app.add_option("--served-model-name", served_name, "the name clients use (default: --model)");
  app.add_option("--host", o.host, "listen address")->capture_default_str();
  app.add_option("--port", o.port, "listen port")->capture_default_str();
  app.add_option("--block-size", o.block_size, "tokens per KV block")
    ->check(CLI::Range(1, 4096))
    ->capture_default_str();
  app.add_option("--num-gpu-blocks", o.num_gpu_blocks, "KV cache size in blocks")
    ->check(CLI::Range(1, 100000000))
    ->capture_default_str();
  app.add_option("--num-gpu-blocks-override", override_blocks, "vLLM's name for the same");
  app.add_option("--max-model-len", o.max_model_len, "prompt + completion tokens at most")
    ->capture_default_str();
  app
    .add_option("--prefix-caching-hash-algo", o.hash_algo,
                "sha256_cbor (reproducible) or anything else (not)")
    ->capture_default_str();
  app.add_flag("--enable-prefix-caching", "always on here");
  app.add_option("--kv-events-config", o.kv_events_config, "vLLM's KV events JSON");
  app.add_flag("--enable-lora", o.enable_lora, "serve LoRA adapters");
  app.add_option("--lora-modules", lora, "NAME=PATH ...")->allow_extra_args(true);
  app.add_option("--data-parallel-size", o.dp_size, "data-parallel ranks")
    ->check(CLI::Range(1, 64))
    ->capture_default_str();
  app.add_flag("--enable-prompt-tokens-details", o.prompt_tokens_details,
               "report usage.prompt_tokens_details.cached_tokens");
  app.add_flag("--enable-scale-out", o.enable_scale_out,
               "serve the render endpoints (/v1/completions/render, /v1/chat/completions/render)");
  auto& b = o.batch;
  app.add_option("--max-num-batched-tokens", b.max_num_batched_tokens, "tokens per step at most")
    ->check(CLI::Range(1, 10000000))
    ->capture_default_str();
  app.add_option("--max-num-seqs", b.max_num_seqs, "requests running at once at most")
    ->check(CLI::Range(1, 100000))
    ->capture_default_str();
  app.add_option("--sim-step-ms", b.step_ms, "fixed time of a step (reading the weights)")
    ->check(CLI::Range(0.0, 10000.0))
    ->capture_default_str();
  app.add_option("--sim-us-per-token", b.us_per_token, "step time per token computed in it")
    ->check(CLI::Range(0.0, 1e6))
    ->capture_default_str();
  app
    .add_option("--sim-ns-per-context-token", b.ns_per_context_token,
                "step time per token attended to (reading its KV)")
    ->check(CLI::Range(0.0, 1e6))
    ->capture_default_str();
  app.add_option("--sim-max-tokens", o.default_max_tokens, "max_tokens when a request has none")
    ->capture_default_str();
  app.add_option("--sim-fail-file", o.fail_file,
                 "while this file exists, answer as vLLM with a dead engine core: /health 503, "
                 "completions 500 (for fault tests)");
  app
    .add_option("--sim-event-churn", o.event_churn,
                "block events a second per rank published beside the real ones: stores of "
                "random blocks and removes of the oldest (benchmark load, llmgw-bench soak)")
    ->capture_default_str();
  std::string as = "vllm";
  app
    .add_option("--sim-as", as, "whose engine to stand in for: vllm, or sglang (its event stream)")
    ->check(CLI::IsMember({"vllm", "sglang"}))
    ->capture_default_str();
  app.add_option("--model-path", o.model, "SGLang's name for --model");
  app.add_option("--page-size", o.block_size, "SGLang's name for --block-size")
    ->check(CLI::Range(1, 4096));
  app.add_option("--sim-event-shape", shape, "array (vLLM before 2026-06) or map")
    ->check(CLI::IsMember({"array", "map"}))
    ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!positional.empty() && positional[0] == "serve")
    positional.erase(positional.begin());
  if (o.model.empty() && !positional.empty())
    o.model = positional[0];
  if (o.model.empty()) {
    fmt::print(stderr, "llmgw-sim: name a model (llmgw-sim serve MODEL or --model MODEL)\n");
    return 2;
  }
  if (!served_name.empty())
    o.model = served_name;
  if (override_blocks)
    o.num_gpu_blocks = override_blocks;
  for (const auto& l : lora) {
    auto eq = l.find('=');
    if (eq == std::string::npos || eq == 0) {
      fmt::print(stderr, "llmgw-sim: --lora-modules takes NAME=PATH, not '{}'\n", l);
      return 2;
    }
    o.lora_modules.emplace_back(l.substr(0, eq), l.substr(eq + 1));
  }
  if (!o.lora_modules.empty() && !o.enable_lora) {
    fmt::print(stderr, "llmgw-sim: --lora-modules needs --enable-lora (as in vLLM)\n");
    return 2;
  }
  if (const char* seed = std::getenv("PYTHONHASHSEED"))
    o.seed = seed;
  if (const char* ints = std::getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"))
    o.int_hashes = std::string(ints) != "0";
  o.event_shape =
    shape == "array" ? llmgw::wire::event_shape::array : llmgw::wire::event_shape::map;
  o.sglang = as == "sglang";
  if (o.sglang && o.event_churn > 0) {
    fmt::print(stderr, "llmgw-sim: --sim-event-churn publishes blocks without tokens, which "
                       "SGLang's stream cannot carry; not with --sim-as sglang\n");
    return 2;
  }
  if (o.sglang && o.enable_scale_out) {
    fmt::print(stderr, "llmgw-sim: --enable-scale-out is vLLM's; SGLang has no render routes\n");
    return 2;
  }

  auto signals = llmgw::apps::block_stop_signals();
  int sig = 0;
  {
    llmgw::sim::engine e(o);
    if (!e.error().empty()) {
      fmt::print(stderr, "llmgw-sim: {}\n", e.error());
      return 1;
    }
    LLMGW_LOG(info, "llmgw-sim", "serving {} on http://{}:{} ({} rank{}, {} blocks of {} tokens{})",
              o.model, o.host, e.port(), o.dp_size, o.dp_size == 1 ? "" : "s", o.num_gpu_blocks,
              o.block_size, o.kv_events_config.empty() ? "" : ", KV events on");
    sigwait(&signals, &sig);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  llmgw::apps::return_large_blocks_when_freed();
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "llmgw-sim: {}\n", e.what());
    return 1;
  }
}
