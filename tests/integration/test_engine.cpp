// llmgw-test-engine: stands in for vLLM when testing how llmgw launches
// engines. Started with vLLM's flags by the engine supervisor, it checks the
// seed and hash algorithm it was given, connects to the --kv-events-config
// endpoint like vLLM's publisher, publishes a capture's frames, and then runs
// until SIGTERM.
//   llmgw-test-engine --capture FILE [--pid-file FILE] [vLLM flags...]
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

namespace {

volatile std::sig_atomic_t stop = 0;
extern "C" void on_term(int) {
  stop = 1;
}

std::string unhex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

} // namespace

int main(int argc, char** argv) {
  std::signal(SIGTERM, on_term);
  std::string capture_path;
  std::string events_config;
  std::string algo;
  std::string block_size;
  for (int i = 1; i + 1 < argc; ++i) {
    std::string a = argv[i];
    if (a == "--capture")
      capture_path = argv[++i];
    else if (a == "--kv-events-config")
      events_config = argv[++i];
    else if (a == "--prefix-caching-hash-algo")
      algo = argv[++i];
    else if (a == "--block-size")
      block_size = argv[++i];
    else if (a == "--pid-file")
      std::ofstream(argv[++i]) << ::getpid() << "\n";
  }
  std::ifstream in(capture_path);
  std::ostringstream buf;
  buf << in.rdbuf();
  auto capture = boost::json::parse(buf.str()).as_object();
  const char* seed = std::getenv("PYTHONHASHSEED");
  if (!seed || capture.at("hash_seed").as_string() != seed) {
    std::fprintf(stderr, "llmgw-test-engine: PYTHONHASHSEED is not the capture's seed\n");
    return 4;
  }
  if (algo != "sha256_cbor") {
    std::fprintf(stderr, "llmgw-test-engine: --prefix-caching-hash-algo is '%s'\n", algo.c_str());
    return 5;
  }
  // The capture's blocks are 16 tokens: the agent must say so, whatever
  // vLLM's default on this platform.
  if (block_size != std::to_string(capture.at("block_size").as_int64())) {
    std::fprintf(stderr, "llmgw-test-engine: --block-size is '%s', not the capture's\n",
                 block_size.c_str());
    return 7;
  }
  if (!events_config.empty()) {
    auto cfg = boost::json::parse(events_config).as_object();
    std::string endpoint(cfg.at("endpoint").as_string());
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::xpub);
    pub.set(zmq::sockopt::linger, 2000);
    pub.set(zmq::sockopt::sndhwm, 0);
    // Wait for the subscription in short slices, so SIGTERM is heard (libzmq
    // retries a poll a signal interrupted); after 10 s exit 6 and let the
    // supervisor start us again.
    pub.set(zmq::sockopt::rcvtimeo, 100);
    if (llmgw::wire::publisher_binds(endpoint)) // as vLLM does
      pub.bind(endpoint);
    else
      pub.connect(endpoint);
    zmq::message_t subscription;
    bool subscribed = false;
    for (int i = 0; i < 100 && !stop && !subscribed; ++i)
      subscribed = pub.recv(subscription).has_value();
    if (stop)
      return 0;
    if (!subscribed) {
      std::fprintf(stderr, "llmgw-test-engine: nobody subscribed at %s\n", endpoint.c_str());
      return 6;
    }
    for (const auto& f : capture.at("frames").as_array()) {
      auto topic = unhex(std::string(f.at("topic_hex").as_string()));
      auto seq = llmgw::wire::encode_seq(static_cast<std::uint64_t>(f.at("seq").as_int64()));
      auto payload = unhex(std::string(f.at("payload_hex").as_string()));
      std::array<zmq::const_buffer, 3> parts = {zmq::buffer(topic), zmq::buffer(seq),
                                                zmq::buffer(payload)};
      zmq::send_multipart(pub, parts);
    }
    std::fprintf(stderr, "llmgw-test-engine: published %zu frames to %s\n",
                 capture.at("frames").as_array().size(), endpoint.c_str());
    while (!stop)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  }
  while (!stop)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return 0;
}
