// Python bindings: torch_pjrt._C. Plugin selection policy lives in Python
// (torch_pjrt/_plugin.py); this module exposes the C++ layers.
#include <ATen/autocast_mode.h>
#include <chrono>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>

#include "device/current_device.h"
#include "device/dtype_map.h"
#include "device/generator.h"
#include "device/lowering_routes.h"
#include "device/storage.h"
#include "eager/cpu_fallback.h"
#include "eager/cpu_threads.h"
#include "eager/executor.h"
#include "eager/fused.h"
#include "eager/plan.h"
#include "lowering/registry.h"
#include "lowering/strided_access.h"
#include "python/distributed_bindings.h"
#include "python/capture_bindings.h"
#include "python/graph_bindings.h"
#include "python/readiness_bindings.h"
#include "runtime/constant_buffers.h"
#include "runtime/pjrt_runtime.h"
#include "runtime/plugin_flags.h"
#include "runtime/program_cache.h"

namespace py = pybind11;
using namespace torch_pjrt;

namespace {

// The buffers of whole, contiguous tpu tensors on one device (tools that call
// the runtime directly), and that device.
std::pair<std::vector<runtime::BufferPtr>, int> whole_buffers(const std::vector<at::Tensor>& args, const char* what) {
  std::vector<runtime::BufferPtr> params;
  int device = 0;
  for (const at::Tensor& t : args) {
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, what,
                      ": arguments must be whole contiguous tpu tensors, got one on ", t.device());
    auto& sb = device::storage_of(t);
    TORCH_CHECK_VALUE(lowering::covers_whole(t.sizes().data(), t.strides().data(), t.dim(), t.storage_offset(),
                                             static_cast<int64_t>(sb.nbytes) / static_cast<int64_t>(t.itemsize())),
                      what, ": arguments must be whole contiguous tpu tensors");
    TORCH_CHECK_VALUE(params.empty() || t.device().index() == device, what, ": arguments on different devices");
    device = t.device().index();
    params.push_back(device::ensure_buffer(sb, device::to_dtype(t.scalar_type())));
  }
  return {std::move(params), device};
}

}  // namespace

PYBIND11_MODULE(torch_pjrt_C, m) {
  // A lowering that does not handle these inputs (a dtype its CPU kernel
  // lacks): a compiled graph is then built around the op, which runs op by
  // op and gives CPU's result or CPU's error (eager paths catch it in C++).
  py::register_exception<lowering::NotImplemented>(m, "LoweringNotImplemented", PyExc_NotImplementedError);
  m.def("init", [](const std::string& path, const std::string& name, int64_t cpu_devices) {
    runtime::Runtime::initialize(path, name, cpu_devices);
    runtime::ProgramCache::get();  // a bad TORCH_PJRT_EXECUTABLE_CACHE_* setting fails the import, not an op
    runtime::Runtime::compile_threads();  // (TORCH_PJRT_COMPILE_THREADS too)
    device::route_composite_ops_to_lowerings();
    device::route_nested_ops_to_cpu();
    eager::read_fallback_setting();  // (bad values fail the import, as the others do)
    eager::read_fused_settings();
    eager::note_home_thread();  // CPU ops of ours elsewhere run serially (cpu_threads.h)
    // torch.autocast("tpu") without a dtype: bfloat16, what TPUs compute in
    // (PyTorch's default for PrivateUse1 is float16). The setting is
    // per thread in PyTorch; this is the importing thread's.
    at::autocast::set_autocast_dtype(c10::DeviceType::PrivateUse1, at::kBFloat16);
  });
  m.def("routed_composite_ops", &device::route_composite_ops_to_lowerings);
  m.def("initialized", &runtime::Runtime::initialized);
  m.def("discover_plugins", &runtime::discover_plugins);
  m.def("resolve_plugin", &runtime::resolve_plugin);
  m.def("plugin_defines_flag", &runtime::plugin_defines_flag);
  // What the persistent cache's entries are written for (plugin, devices,
  // XLA_FLAGS): lists of entries kept beside the cache key on it too.
  m.def("cache_identity", [] { return runtime::Runtime::get().persistent_cache().identity(); });
  m.def("drop_flags_unknown_to", &runtime::drop_flags_unknown_to);
  m.def("count_ops", &runtime::count_ops);
  m.def("suits_small_program_options", &runtime::suits_small_program_options);
  m.def("wait_for_compiles", &runtime::Runtime::wait_for_compiles, py::call_guard<py::gil_scoped_release>());
  m.def("small_programs_apart", [] { return runtime::Runtime::get().small_programs_apart(); });
  m.def("plugin_info", [] {
    const auto& info = runtime::Runtime::get().info();
    py::dict d;
    d["name"] = info.name;
    d["path"] = info.path;
    d["platform"] = info.platform;
    d["platform_version"] = info.platform_version;
    d["api_version"] = py::make_tuple(info.api_major, info.api_minor);
    py::dict attrs;
    for (const auto& [k, v] : info.attributes) attrs[py::str(k)] = v;
    d["attributes"] = attrs;
    return d;
  });
  m.def("device_count", &device::device_count);
  m.def("current_device", &device::current_device);
  m.def("set_device", &device::set_current_device);
  m.def("device_kind", [](int i) { return runtime::Runtime::get().device_kind(i); });
  m.def("synchronize", [](int device) {
    py::gil_scoped_release release;
    eager::fused_flush("synchronize");
    runtime::Runtime::get().synchronize(device);
  });
  // Activation checkpointing's random state (torch_pjrt/_compile/rng_state.py):
  // a key drawn from the device generator, and a key forced on this thread.
  m.def("draw_rng_key", [](int device) {
    auto k = device::next_rng_key(std::nullopt, device);
    return std::make_pair(static_cast<int64_t>(k.first), static_cast<int64_t>(k.second));
  });
  m.def("force_rng_key", [](std::optional<std::pair<int64_t, int64_t>> key) {
    if (!key) return device::force_rng_key(std::nullopt);
    device::force_rng_key(std::make_pair(static_cast<uint64_t>(key->first), static_cast<uint64_t>(key->second)));
  });
  m.def("default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(THPGenerator_Wrap(device::default_generator(device)));
  });
  m.def("memory_allocated", [](int d) { return runtime::Runtime::get().memory_stats(d).allocated; });
  m.def("max_memory_allocated", [](int d) { return runtime::Runtime::get().memory_stats(d).peak; });
  m.def("reset_peak_memory_stats", &device::reset_peak_memory);
  m.def("reset_accumulated_memory_stats", [](int d) {
    runtime::Runtime::get().check_device(d);
    runtime::reset_accumulated(d);
  });
  m.def("memory_reserved", [](int d) { return device::reserved_bytes(d).current; });
  m.def("max_memory_reserved", [](int d) { return device::reserved_bytes(d).peak; });
  // PyTorch's allocator statistics flattened as torch.cuda / torch.accelerator
  // memory_stats() name them ("allocated_bytes.all.current", ...).
  m.def("allocator_stats", [](int d) {
    c10::CachingDeviceAllocator::DeviceStats st = device::device_stats(d);
    py::dict r;
    const char* pools[] = {"all", "small_pool", "large_pool"};
    auto add = [&](const char* name, const c10::CachingDeviceAllocator::StatArray& a) {
      for (size_t i = 0; i < a.size() && i < 3; ++i) {
        std::string k = std::string(name) + "." + pools[i] + ".";
        r[py::str(k + "current")] = a[i].current;
        r[py::str(k + "peak")] = a[i].peak;
        r[py::str(k + "allocated")] = a[i].allocated;
        r[py::str(k + "freed")] = a[i].freed;
      }
    };
    add("allocation", st.allocation);
    add("segment", st.segment);
    add("active", st.active);
    add("inactive_split", st.inactive_split);
    add("allocated_bytes", st.allocated_bytes);
    add("reserved_bytes", st.reserved_bytes);
    add("active_bytes", st.active_bytes);
    add("inactive_split_bytes", st.inactive_split_bytes);
    add("requested_bytes", st.requested_bytes);
    r["num_alloc_retries"] = st.num_alloc_retries;
    r["num_ooms"] = st.num_ooms;
    return r;
  });
  m.def("empty_cache", [] { runtime::Runtime::get().release_finished(-1); });
  m.def("memory_stats", [](int d) {
    runtime::MemoryStats s = runtime::Runtime::get().memory_stats(d);
    py::dict r;
    r["allocated_bytes"] = s.allocated;
    r["peak_allocated_bytes"] = s.peak;
    r["held_by_queue_bytes"] = s.held_by_queue;
    r["queued_executions"] = s.queued_executions;
    r["limit_bytes"] = s.limit;
    r["total_bytes"] = s.total;
    if (s.plugin_reports) {
      r["plugin_bytes_in_use"] = s.plugin_bytes_in_use;
      r["plugin_peak_bytes_in_use"] = s.plugin_peak_bytes_in_use;
      r["plugin_bytes_limit"] = s.plugin_bytes_limit;
      r["plugin_bytes_reserved"] = s.plugin_bytes_reserved;
    }
    return r;
  });
  m.def("mem_get_info", [](int d) { return runtime::Runtime::get().mem_get_info(d); });
  m.def("total_memory", [](int d) { return runtime::Runtime::get().total_memory(d); });
  m.def("memory_limit", [](int d) { return runtime::Runtime::get().memory_limit(d); });
  m.def("set_memory_limit", [](int d, int64_t bytes) { runtime::Runtime::get().set_memory_limit(d, bytes); });
  m.def("max_inflight", [] { return runtime::Runtime::get().max_inflight(); });
  m.def("set_max_inflight", [](int n) { runtime::Runtime::get().set_max_inflight(n); });
  m.def("in_bad_fork", &runtime::in_forked_child);
  // Raises what any tpu use raises where the device cannot be used (a forked child).
  m.def("check_usable", [] { runtime::Runtime::get(); });
  m.def("executable_cache_bounds", [] {
    auto& c = runtime::ProgramCache::get();
    return py::make_tuple(c.max_entries(), c.max_bytes());
  });
  m.def("set_executable_cache_bounds", [](int64_t entries, int64_t bytes) {
    runtime::ProgramCache::get().set_bounds(entries, bytes);
  });
  m.def("metrics", [] {
    // Counts every execution queued before the call (launch thread included).
    if (runtime::Runtime::initialized() && !runtime::in_forked_child()) {
      py::gil_scoped_release release;
      runtime::Runtime::get().await_launches();
    }
    auto& mt = runtime::metrics();
    py::dict d;
    d["xla_compiles"] = mt.xla_compiles.load();
    d["thread_compiles"] = mt.thread_compiles.load();
    d["thread_compiles_joined"] = mt.thread_compiles_joined.load();
    d["compile_seconds"] = mt.compile_seconds.load();
    d["executable_cache_hits"] = mt.executable_cache_hits.load();
    d["executable_cache_misses"] = mt.executable_cache_misses.load();
    d["executions"] = mt.executions.load();
    d["execute_call_seconds"] = mt.execute_call_seconds.load();
    d["host_to_device_bytes"] = mt.host_to_device_bytes.load();
    d["device_to_host_bytes"] = mt.device_to_host_bytes.load();
    d["host_reads_in_place"] = mt.host_reads_in_place.load();
    d["device_to_device_bytes"] = mt.device_to_device_bytes.load();
    d["host_waits"] = mt.host_waits.load();
    d["persistent_cache_hits"] = mt.persistent_cache_hits.load();
    d["persistent_cache_misses"] = mt.persistent_cache_misses.load();
    d["persistent_cache_writes"] = mt.persistent_cache_writes.load();
    d["persistent_cache_scans"] = mt.persistent_cache_scans.load();
    d["persistent_cache_errors"] = mt.persistent_cache_errors.load();
    d["persistent_cache_load_seconds"] = mt.persistent_cache_load_seconds.load();
    d["persistent_cache_save_seconds"] = mt.persistent_cache_save_seconds.load();
    d["persistent_cache_evictions"] = runtime::Runtime::get().persistent_cache().evictions();
    d["executable_cache_size"] = eager::executable_cache_size();
    d["constant_buffers"] = static_cast<int64_t>(runtime::constant_buffer_count());
    d["executable_cache_bytes"] = runtime::ProgramCache::get().bytes();
    d["executable_cache_evictions"] = runtime::ProgramCache::get().evictions();
    d["executable_cache_mapping_evictions"] = runtime::ProgramCache::get().mapping_evictions();
    d["queue_full_waits"] = mt.queue_full_waits.load();
    d["memory_drains"] = mt.memory_drains.load();
    d["out_of_memory_errors"] = mt.out_of_memory_errors.load();
    d["device_check_failures"] = mt.device_check_failures.load();
    d["async_launches"] = mt.async_launches.load();
    d["launch_waits"] = mt.launch_waits.load();
    d["caller_launches"] = mt.caller_launches.load();
    py::dict fallbacks;
    for (const auto& [op, n] : eager::cpu_fallback_counts()) fallbacks[py::str(op)] = n;
    d["cpu_fallbacks"] = fallbacks;
    eager::FusedStats fs = eager::fused_stats();
    d["fused_ops_recorded"] = fs.ops_recorded;
    d["fused_flushes"] = fs.flushes;
    py::dict reasons;
    for (const auto& [why, n] : fs.flushes_by_reason) reasons[py::str(why)] = n;
    d["fused_flushes_by_reason"] = reasons;
    d["fused_ops_per_flush"] = fs.flushes ? static_cast<double>(fs.ops_recorded) / fs.flushes : 0.0;
    d["fused_max_ops_per_flush"] = fs.max_ops_per_flush;
    d["fused_pipeline_cuts_learned"] = fs.pipeline_cuts_learned;
    d["fused_programs_compiled"] = fs.programs_compiled;
    d["fused_compile_seconds"] = fs.compile_seconds;
    d["fused_cache_hits"] = fs.cache_hits;
    d["fused_op_by_op_runs"] = fs.op_by_op_runs;
    d["fused_deferred_compiles"] = fs.deferred_compiles;
    d["fused_runs_while_compiling"] = fs.runs_while_compiling;
    d["fused_compile_failures"] = fs.compile_failures;
    d["fused_cache_size"] = fs.cache_size;
    d["fused_dead_traces"] = fs.dead_traces;
    d["fused_programs_recorded"] = fs.programs_recorded;
    d["fused_donated_buffers"] = fs.donated_buffers;
    d["fused_donated_bytes"] = fs.donated_bytes;
    d["fused_not_donated_buffers"] = fs.not_donated_buffers;
    return d;
  });
  // Compiles MLIR text with the plugin and returns the number of outputs
  // (surfaces the plugin's own error messages; used by tests and tools).
  m.def("compile_program", [](const std::string& text) {
    return runtime::Runtime::get().compile(text)->num_outputs();
  });
  // Seconds per call of the runtime's execute (queue bookkeeping, the
  // plugin's launch, output buffers made and released) for the program
  // `text` on whole, contiguous tpu tensors, `n` calls and one wait: the
  // floor under a strict eager op's launch, without PyTorch's dispatch
  // (benchmarks/fused_eager.py). `on_launch_thread`: through
  // Runtime::launch, timing the caller's side until the last call returns.
  m.def(
      "execute_floor",
      [](const std::string& text, const std::vector<at::Tensor>& args, int64_t n, bool on_launch_thread) {
        TORCH_CHECK_VALUE(n > 0, "execute_floor: n must be positive, got ", n);
        py::gil_scoped_release release;
        auto& rt = runtime::Runtime::get();
        auto [params, device] = whole_buffers(args, "execute_floor");
        auto exe = rt.compile(text);
        rt.synchronize(device);
        auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < n; ++i) {
          if (on_launch_thread)
            rt.launch(exe, params, device);
          else
            rt.execute(*exe, params, device);
        }
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rt.synchronize(device);
        if (!on_launch_thread) seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return seconds / static_cast<double>(n);
      },
      py::arg("text"), py::arg("args"), py::arg("n"), py::arg("on_launch_thread") = false);
  // Seconds of each of `n` calls of the program `text` run as a training loop
  // runs it: each call donates the inputs the program aliases (`aliases`:
  // (input, output) pairs), its outputs become the next call's inputs, and
  // the call waits for the device. Afterwards the argument tensors hold the
  // last call's values. How benchmarks/capture_vs_jax.py runs JAX's own step
  // program on this runtime, as JAX's client runs it.
  m.def(
      "time_program_chain",
      [](const std::string& text, const std::vector<at::Tensor>& args,
         const std::vector<std::pair<int64_t, int64_t>>& aliases, int64_t n) {
        TORCH_CHECK_VALUE(n > 0, "time_program_chain: n must be positive, got ", n);
        auto [params, device] = whole_buffers(args, "time_program_chain");
        std::vector<int64_t> donated;
        for (const auto& [in, out] : aliases) {
          TORCH_CHECK_INDEX(in >= 0 && in < static_cast<int64_t>(params.size()), "time_program_chain: input ", in,
                            " out of range for ", params.size(), " arguments");
          donated.push_back(in);
        }
        std::vector<double> seconds;
        auto& rt = runtime::Runtime::get();
        runtime::ExecutablePtr exe;
        {
          py::gil_scoped_release release;
          exe = rt.compile(text);
        }
        for (const auto& [in, out] : aliases)
          TORCH_CHECK_INDEX(out >= 0 && out < static_cast<int64_t>(exe->num_outputs()), "time_program_chain: output ",
                            out, " out of range for ", exe->num_outputs(), " outputs");
        // The argument tensors take the latest buffers even when a call fails
        // (their old ones may have been donated).
        auto write_back = [&] {
          for (size_t i = 0; i < args.size(); ++i) device::storage_of(args[i]).buffer = params[i];
        };
        try {
          py::gil_scoped_release release;
          rt.synchronize(device);
          for (int64_t i = 0; i < n; ++i) {
            auto start = std::chrono::steady_clock::now();
            auto outs = rt.execute(*exe, params, device, donated);
            rt.synchronize(device);
            seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            for (const auto& [in, out] : aliases) params[in] = outs[out];
          }
        } catch (...) {
          write_back();
          throw;
        }
        write_back();
        return seconds;
      },
      py::arg("text"), py::arg("args"), py::arg("aliases"), py::arg("n"));
  // Queues the program `text` on the launch thread with whole tpu tensors as
  // arguments, without checking them against the program (the plugin does,
  // on that thread); `read`: then waits for the first output, raising the
  // launch's error. For tests of failed launches.
  m.def("launch_program", [](const std::string& text, const std::vector<at::Tensor>& args, bool read) {
    py::gil_scoped_release release;
    auto& rt = runtime::Runtime::get();
    auto [params, device] = whole_buffers(args, "launch_program");
    auto outs = rt.launch(rt.compile(text), params, device);
    if (read && !outs.empty()) outs[0]->get();
    return outs.size();
  });
  m.def("set_async_launch", [](bool on) {
    py::gil_scoped_release release;
    runtime::set_async_launch(on);
  });
  m.def("async_launch_enabled", &runtime::async_launch_enabled);
  m.def("clear_executable_cache", &eager::clear_executable_cache);
  m.def("fused_enter", &eager::fused_enter);
  m.def("set_fused_pipeline", &eager::set_fused_pipeline);
  m.def("fused_leave", [] {
    py::gil_scoped_release release;
    eager::fused_leave();
  });
  m.def("fused_flush", [] {
    py::gil_scoped_release release;
    eager::fused_flush("explicit");
  });
  m.def("fused_active", &eager::fused_active);
  m.def("float_modes", &eager::float_modes);
  m.def("record_programs", &eager::record_programs);
  m.def("take_recorded_programs", &eager::take_recorded_programs);
  // Calls that ran through the CPU fallback so far (cheap: the assessment asks per op).
  m.def("cpu_fallback_calls", [] {
    int64_t n = 0;
    for (const auto& [op, k] : eager::cpu_fallback_counts()) n += k;
    return n;
  });
  m.def("checks_enabled", &eager::checks_enabled);
  m.def("set_checks_enabled", &eager::set_checks_enabled);
  m.def("registered_lowerings", &lowering::registered_lowerings);
  m.def("lowering_table", &lowering::lowering_table);
  python::bind_graph(m);
  python::bind_capture(m);
  python::bind_readiness(m);
  python::bind_distributed(m);
}
