#include "config/engine_command.hpp"

#include <boost/json.hpp>

#include <cstdlib>

namespace llmgw::config {

namespace {

/// Removes `--flag value` and `--flag=value` from argv.
void remove_flag(std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (i > 0 && argv[i] == flag) {
      if (i + 1 < argv.size())
        ++i; // and its value
      continue;
    }
    if (i > 0 && argv[i].rfind(flag + "=", 0) == 0)
      continue;
    out.push_back(argv[i]);
  }
  argv = std::move(out);
}

} // namespace

std::string kv_events_config_json(const engine_launch_options& opts) {
  boost::json::object cfg;
  if (opts.kind == engine_kind::vllm)
    cfg["enable_kv_cache_events"] = true; // SGLang's config has no such field
  cfg["publisher"] = "zmq";
  cfg["endpoint"] = opts.events_endpoint;
  if (!opts.replay_endpoint.empty())
    cfg["replay_endpoint"] = opts.replay_endpoint;
  cfg["topic"] = opts.topic;
  return boost::json::serialize(cfg);
}

engine_launch make_engine_launch(const engine_launch_options& opts) {
  if (opts.kind == engine_kind::trtllm)
    std::abort(); // the topology refuses to launch it: its block size is YAML, not a flag
  engine_launch launch;
  launch.argv = opts.command;
  if (opts.kind == engine_kind::vllm) {
    remove_flag(launch.argv, "--prefix-caching-hash-algo");
    launch.argv.emplace_back("--prefix-caching-hash-algo");
    launch.argv.emplace_back("sha256_cbor");
  }
  if (opts.block_size > 0) {
    std::string flag = block_size_flag(opts.kind);
    remove_flag(launch.argv, flag);
    launch.argv.push_back(flag);
    launch.argv.push_back(std::to_string(opts.block_size));
  }
  remove_flag(launch.argv, "--kv-events-config");
  if (opts.kv_events) {
    launch.argv.emplace_back("--kv-events-config");
    launch.argv.push_back(kv_events_config_json(opts));
  }
  launch.env.emplace_back("PYTHONHASHSEED", opts.seed);
  return launch;
}

} // namespace llmgw::config
