// Bindings for dvm/graph.h (GraphBuilder, Graph, Executable, GraphRunStats) and dvm/models.h.
//
// Python's GraphBuilder wraps the C++ one so that using it after build() raises instead of
// touching a definition the built Graph shares.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <sstream>

#include "bindings.h"
#include "dvm/graph.h"
#include "dvm/models.h"
#include "torch_call_api.h"

namespace dvm::python {
namespace {

using OptTensor = std::optional<Tensor>;

Tensor opt(const OptTensor& t) {
  return t ? *t : Tensor{};
}

class PyGraphBuilder {
 public:
  explicit PyGraphBuilder(std::string name)
      : name_(name), gb_(std::make_unique<GraphBuilder>(std::move(name))) {}

  GraphBuilder& gb() {
    if (!gb_) {
      throw StatusError(Status(StatusCode::kFailedPrecondition,
                               name_ + ": GraphBuilder used after build(); start a new one"));
    }
    return *gb_;
  }
  Graph build() {
    StatusOr<Graph> g = gb().build();
    gb_.reset();  // built or failed, the definition is frozen
    return value_or_raise(std::move(g));
  }

 private:
  std::string name_;
  std::unique_ptr<GraphBuilder> gb_;
};

struct PyExecutable {
  std::shared_ptr<Executable> exe;
};

GraphRunStats run(const PyExecutable& x, nb::handle inputs, nb::handle outputs) {
  const Graph& g = x.exe->source();
  ConvertedArrays in = convert_arrays(inputs, "input", g.input_names());
  ConvertedArrays out = convert_arrays(outputs, "output", g.output_names());
  GraphRunStats stats;
  Status st;
  {
    nb::gil_scoped_release release;
    st = x.exe->run(in.args, out.args, &stats);
  }
  raise_if_error(st);
  return stats;
}

// exe(*inputs): outputs allocated once the inputs are bound (one binding per call, not
// output_shapes() then run()). The GIL is released for the kernels, held to allocate.
nb::list call(const PyExecutable& x, nb::args inputs) {
  const Graph& g = x.exe->source();
  ConvertedArrays in = convert_arrays(inputs, "input", g.input_names());
  bool like_torch = false;
  for (nb::handle h : inputs) like_torch = like_torch || is_torch_tensor(h);
  const std::vector<DType> dtypes = x.exe->output_dtypes();
  std::vector<nb::object> outs;
  Status st;
  {
    nb::gil_scoped_release release;
    st = x.exe->run(in.args,
                    [&](const std::vector<std::vector<int64_t>>& shapes,
                        std::vector<TensorArg>* args) -> Status {
                      nb::gil_scoped_acquire acquire;
                      try {
                        outs = allocate_outputs(shapes, dtypes, like_torch, args);
                      } catch (const StatusError& e) {
                        return e.status();
                      } catch (const std::exception& e) {
                        return internal_error(std::string("allocating outputs: ") + e.what());
                      }
                      return Status::ok();
                    });
  }
  raise_if_error(st);
  nb::list result;
  for (nb::object& o : outs) result.append(o);
  return result;
}

// TorchCallApi::run: the executable's call for dvm._dvm_torch (see torch_call_api.h).
int torch_api_run(PyObject* exe, const std::vector<TensorArg>& inputs,
                  const TorchCallApi::Allocate& allocate) {
  try {
    const PyExecutable& x = nb::cast<const PyExecutable&>(nb::handle(exe));
    const std::vector<DType> dtypes = x.exe->output_dtypes();
    Status st;
    {
      nb::gil_scoped_release release;
      st = x.exe->run(
          inputs,
          [&](const std::vector<std::vector<int64_t>>& shapes,
              std::vector<TensorArg>* args) -> Status {
            std::string error;
            if (allocate(shapes, dtypes, args, &error)) return Status::ok();
            return internal_error(x.exe->source().name() + ": allocating outputs: " + error);
          });
    }
    raise_if_error(st);
    return 0;
  } catch (...) {
    // What nanobind would raise from a binding: DvmError for a Status, TypeError for a cast.
    try {
      throw;
    } catch (nb::python_error& e) {
      e.restore();
    } catch (const nb::cast_error&) {
      PyErr_SetString(PyExc_TypeError, "expected a dvm.Executable");
    } catch (const StatusError& e) {
      set_python_error(e.status());
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return -1;
  }
}

std::vector<std::vector<int64_t>> output_shapes(const PyExecutable& x, nb::handle inputs) {
  ConvertedArrays in = convert_arrays(inputs, "input", x.exe->source().input_names());
  return value_or_raise(x.exe->output_shapes(in.args));
}

std::map<std::string, int64_t> bind(const PyExecutable& x, nb::handle inputs) {
  ConvertedArrays in = convert_arrays(inputs, "input", x.exe->source().input_names());
  SymBindings b = value_or_raise(x.exe->bind(in.args));
  return std::map<std::string, int64_t>(b.begin(), b.end());
}

std::string stats_repr(const GraphRunStats& s) {
  std::ostringstream os;
  os << "GraphRunStats(kernels_launched=" << s.kernels_launched
     << ", native_launched=" << s.native_launched << ", kernels_stacked=" << s.kernels_stacked
     << ", programs_encoded=" << s.programs_encoded << ", cache_hits=" << s.cache_hits
     << ", encode_us=" << s.encode_us << ", bind_us=" << s.bind_us
     << ", bytes_moved=" << s.bytes_moved << ", peak_bytes=" << s.peak_bytes
     << ", prepared=" << (s.prepared ? "True" : "False") << ")";
  return os.str();
}

void bind_builder_ops(nb::class_<PyGraphBuilder>& c) {
  using B = PyGraphBuilder;
  c.def("unary", [](B& b, UnaryOp op, Tensor x) { return b.gb().unary(op, x); })
      .def("binary", [](B& b, BinaryOp op, Tensor x, Tensor y) { return b.gb().binary(op, x, y); })
      .def("binary", [](B& b, BinaryOp op, Tensor x, double y) { return b.gb().binary(op, x, y); })
      .def("binary", [](B& b, BinaryOp op, double x, Tensor y) { return b.gb().binary(op, x, y); })
      .def("select", [](B& b, Tensor c, Tensor x, Tensor y) { return b.gb().select(c, x, y); })
      .def("cast", [](B& b, Tensor x, DType t) { return b.gb().cast(x, t); })
      .def("expand", [](B& b, Tensor x, SymShape s) { return b.gb().expand(x, std::move(s)); })
      .def("reshape", [](B& b, Tensor x, SymShape s) { return b.gb().reshape(x, std::move(s)); })
      .def("permute",
           [](B& b, Tensor x, std::vector<int> p) { return b.gb().permute(x, std::move(p)); })
      .def("transpose", [](B& b, Tensor x, int a0, int a1) { return b.gb().transpose(x, a0, a1); })
      .def("unsqueeze", [](B& b, Tensor x, int axis) { return b.gb().unsqueeze(x, axis); })
      .def("squeeze", [](B& b, Tensor x, int axis) { return b.gb().squeeze(x, axis); })
      .def(
          "slice",
          [](B& b, Tensor x, int axis, SymExpr start, SymExpr stop, int64_t step) {
            return b.gb().slice(x, axis, start, stop, step);
          },
          nb::arg("x"), nb::arg("axis"), nb::arg("start"), nb::arg("stop"), nb::arg("step") = 1)
      .def("concat", [](B& b, std::vector<Tensor> xs,
                        int axis) { return b.gb().concat(std::move(xs), axis); })
      .def("split", [](B& b, Tensor x, std::vector<SymExpr> sizes,
                       int axis) { return b.gb().split(x, std::move(sizes), axis); })
      .def(
          "reduce",
          [](B& b, ReduceOp op, Tensor x, std::vector<int> axes, bool keepdims) {
            return b.gb().reduce(op, x, std::move(axes), keepdims);
          },
          nb::arg("op"), nb::arg("x"), nb::arg("axes"), nb::arg("keepdims") = false)
      .def(
          "matmul",
          [](B& b, Tensor x, Tensor y, bool ta, bool tb) { return b.gb().matmul(x, y, ta, tb); },
          nb::arg("a"), nb::arg("b"), nb::arg("transpose_a") = false,
          nb::arg("transpose_b") = false)
      .def("index_select",
           [](B& b, Tensor x, int axis, Tensor i) { return b.gb().index_select(x, axis, i); })
      .def("gather", [](B& b, Tensor x, int axis, Tensor i) { return b.gb().gather(x, axis, i); })
      .def(
          "cumsum", [](B& b, Tensor x, int axis) { return b.gb().cumsum(x, axis); }, nb::arg("x"),
          nb::arg("axis"))
      .def(
          "iota",
          [](B& b, SymShape s, int axis, DType t) { return b.gb().iota(std::move(s), axis, t); },
          nb::arg("shape"), nb::arg("axis"), nb::arg("dtype") = DType::kI64);
}

void bind_builder_composites(nb::class_<PyGraphBuilder>& c) {
  using B = PyGraphBuilder;
  c.def("softmax", [](B& b, Tensor x, int axis) { return b.gb().softmax(x, axis); })
      .def("log_softmax", [](B& b, Tensor x, int axis) { return b.gb().log_softmax(x, axis); })
      .def(
          "layer_norm",
          [](B& b, Tensor x, OptTensor w, OptTensor bias, double eps, int num_axes) {
            return b.gb().layer_norm(x, opt(w), opt(bias), eps, num_axes);
          },
          nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
          nb::arg("eps") = 1e-5, nb::arg("num_axes") = 1)
      .def(
          "rms_norm",
          [](B& b, Tensor x, OptTensor w, double eps, int num_axes) {
            return b.gb().rms_norm(x, opt(w), eps, num_axes);
          },
          nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("eps") = 1e-6,
          nb::arg("num_axes") = 1)
      .def(
          "gelu", [](B& b, Tensor x, bool tanh) { return b.gb().gelu(x, tanh); }, nb::arg("x"),
          nb::arg("tanh_approximation") = false)
      .def("silu", [](B& b, Tensor x) { return b.gb().silu(x); })
      .def("swiglu", [](B& b, Tensor g, Tensor u) { return b.gb().swiglu(g, u); })
      .def(
          "linear",
          [](B& b, Tensor x, Tensor w, OptTensor bias) { return b.gb().linear(x, w, opt(bias)); },
          nb::arg("x"), nb::arg("weight"), nb::arg("bias") = nb::none())
      .def("embedding", [](B& b, Tensor w, Tensor ids) { return b.gb().embedding(w, ids); })
      .def(
          "variance",
          [](B& b, Tensor x, std::vector<int> axes, double correction, bool keepdims) {
            return b.gb().variance(x, std::move(axes), correction, keepdims);
          },
          nb::arg("x"), nb::arg("axes"), nb::arg("correction") = 1.0, nb::arg("keepdims") = false)
      .def(
          "std_dev",
          [](B& b, Tensor x, std::vector<int> axes, double correction, bool keepdims) {
            return b.gb().std_dev(x, std::move(axes), correction, keepdims);
          },
          nb::arg("x"), nb::arg("axes"), nb::arg("correction") = 1.0, nb::arg("keepdims") = false)
      .def("cross_entropy", [](B& b, Tensor l, Tensor t) { return b.gb().cross_entropy(l, t); })
      .def(
          "attention",
          [](B& b, Tensor q, Tensor k, Tensor v, OptTensor mask, bool causal, double scale) {
            return b.gb().attention(q, k, v, opt(mask), causal, scale);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask") = nb::none(),
          nb::arg("causal") = false, nb::arg("scale") = 0.0)
      .def(
          "clamp",
          [](B& b, Tensor x, std::optional<double> lo, std::optional<double> hi) {
            return b.gb().clamp(x, lo, hi);
          },
          nb::arg("x"), nb::arg("lo") = nb::none(), nb::arg("hi") = nb::none());
}

void bind_executable(nb::module_& m) {
  nb::class_<GraphCompileOptions>(m, "GraphCompileOptions")
      .def(nb::init<>())
      .def_rw("fuse", &GraphCompileOptions::fuse)
      .def_rw("optimize", &GraphCompileOptions::optimize)
      .def_rw("num_threads", &GraphCompileOptions::num_threads);

  nb::class_<GraphRunStats>(m, "GraphRunStats", "Statistics of one Executable.run() call.")
      .def(nb::init<>())
      .def_ro("kernels_launched", &GraphRunStats::kernels_launched)
      .def_ro("native_launched", &GraphRunStats::native_launched)
      .def_ro("kernels_stacked", &GraphRunStats::kernels_stacked)
      .def_ro("programs_encoded", &GraphRunStats::programs_encoded)
      .def_ro("cache_hits", &GraphRunStats::cache_hits)
      .def_ro("encode_us", &GraphRunStats::encode_us)
      .def_ro("bind_us", &GraphRunStats::bind_us)
      .def_ro("bytes_moved", &GraphRunStats::bytes_moved)
      .def_ro("peak_bytes", &GraphRunStats::peak_bytes)
      .def_ro("prepared", &GraphRunStats::prepared)
      .def("__repr__", &stats_repr);

  static const TorchCallApi api{TorchCallApi::kVersion, &torch_api_run, &dvm::set_parallel_backend};
  m.attr("_torch_call_api") =
      nb::capsule(static_cast<const void*>(&api), TorchCallApi::kCapsuleName);

  nb::class_<PyExecutable>(m, "Executable",
                           "A graph compiled once (decompose, simplify, fuse, plan memory) and "
                           "run for any binding of its symbols. Safe to run from several threads.")
      .def_static(
          "compile",
          [](const Graph& g, bool fuse, bool optimize, int num_threads) {
            GraphCompileOptions o;
            o.fuse = fuse;
            o.optimize = optimize;
            o.num_threads = num_threads;
            std::shared_ptr<Executable> exe;
            {
              nb::gil_scoped_release release;
              StatusOr<std::shared_ptr<Executable>> r = Executable::compile(g, o);
              if (!r.is_ok()) {
                nb::gil_scoped_acquire acquire;
                throw StatusError(r.status());
              }
              exe = *r;
            }
            return PyExecutable{std::move(exe)};
          },
          nb::arg("graph"), nb::arg("fuse") = true, nb::arg("optimize") = true,
          nb::arg("num_threads") = 0)
      .def("run", &run, nb::arg("inputs"), nb::arg("outputs"),
           "Runs into caller-provided outputs (written in place, zero-copy); returns stats.")
      .def("call", &call,
           "exe.call(*inputs): runs into fresh outputs (torch tensors when an input is one, "
           "else numpy arrays) and returns them as a list.")
      .def("output_shapes", &output_shapes, nb::arg("inputs"))
      .def("bind", &bind, nb::arg("inputs"), "The symbol values these inputs bind.")
      .def("output_dtypes", [](const PyExecutable& x) { return x.exe->output_dtypes(); })
      .def(
          "peak_bytes",
          [](const PyExecutable& x, const std::map<std::string, int64_t>& b) {
            return value_or_raise(x.exe->peak_bytes(SymBindings(b.begin(), b.end())));
          },
          nb::arg("bindings"))
      .def("fusion_report", [](const PyExecutable& x) { return utf8_text(x.exe->fusion_report()); })
      .def_prop_ro("num_kernels", [](const PyExecutable& x) { return x.exe->num_kernels(); })
      .def_prop_ro("num_threads", [](const PyExecutable& x) { return x.exe->num_threads(); })
      .def_prop_ro("source", [](const PyExecutable& x) { return x.exe->source(); })
      .def_prop_ro("optimized", [](const PyExecutable& x) { return x.exe->optimized(); });
}

}  // namespace

void bind_graph(nb::module_& m) {
  nb::class_<Tensor>(m, "Tensor", "A value of a graph under construction (a handle).")
      .def_ro("id", &Tensor::id)
      .def("__repr__", [](const Tensor& t) { return "Tensor(%" + std::to_string(t.id) + ")"; });

  nb::class_<Graph>(m, "Graph", "An immutable tensor graph with symbolic shapes.")
      .def_prop_ro("name", [](const Graph& g) { return utf8_text(g.name()); })
      .def_prop_ro("num_inputs", &Graph::num_inputs)
      .def_prop_ro("num_outputs", &Graph::num_outputs)
      .def_prop_ro("num_nodes", &Graph::num_nodes)
      .def_prop_ro("input_names", [](const Graph& g) { return utf8_texts(g.input_names()); })
      .def_prop_ro("input_dtypes", &Graph::input_dtypes)
      .def_prop_ro("input_shapes", &Graph::input_shapes)
      .def_prop_ro("output_names", [](const Graph& g) { return utf8_texts(g.output_names()); })
      .def_prop_ro("output_dtypes", &Graph::output_dtypes)
      .def_prop_ro("output_shapes", &Graph::output_shapes)
      .def("to_string", [](const Graph& g) { return utf8_text(g.to_string()); })
      .def("__str__", [](const Graph& g) { return utf8_text(g.to_string()); });
  m.def(
      "parse_graph", [](const std::string& text) { return value_or_raise(parse_graph(text)); },
      nb::arg("text"), "Parses the text form printed by Graph.to_string().");
  m.def(
      "parse_graph",
      [](const nb::bytes& text) {
        return value_or_raise(parse_graph(std::string_view(text.c_str(), text.size())));
      },
      nb::arg("text"), "The same from bytes (errors quote undecodable bytes as U+FFFD).");

  nb::class_<PyGraphBuilder> c(
      m, "GraphBuilder", "Records tensor ops with symbolic shapes; build() freezes the graph.");
  c.def(nb::init<std::string>(), nb::arg("name"))
      .def(
          "symbol",
          [](PyGraphBuilder& b, const std::string& name, int64_t lo, int64_t hi) {
            return b.gb().symbol(name, SymRange{lo, hi});
          },
          nb::arg("name"), nb::arg("lo") = 1, nb::arg("hi") = kSymMax)
      .def(
          "input",
          [](PyGraphBuilder& b, const std::string& name, DType t, SymShape s) {
            return b.gb().input(name, t, std::move(s));
          },
          nb::arg("name"), nb::arg("dtype"), nb::arg("shape"))
      .def(
          "constant", [](PyGraphBuilder& b, double v, DType t) { return b.gb().constant(v, t); },
          nb::arg("value"), nb::arg("dtype") = DType::kF32)
      .def("output",
           [](PyGraphBuilder& b, const std::string& name, Tensor t) { b.gb().output(name, t); })
      .def("shape", [](PyGraphBuilder& b, Tensor t) { return b.gb().shape(t); })
      .def("dtype", [](PyGraphBuilder& b, Tensor t) { return b.gb().dtype(t); })
      .def("rank", [](PyGraphBuilder& b, Tensor t) { return b.gb().rank(t); })
      .def("build", &PyGraphBuilder::build);
  bind_builder_ops(c);
  bind_builder_composites(c);
  m.attr("SLICE_END") = kSymMax;
  bind_executable(m);

  nb::module_ models = m.def_submodule("models", "Reference model graphs (dvm/models.h).");
  nb::class_<models::TransformerConfig>(models, "TransformerConfig")
      .def(nb::init<>())
      .def_rw("hidden", &models::TransformerConfig::hidden)
      .def_rw("heads", &models::TransformerConfig::heads)
      .def_rw("ffn", &models::TransformerConfig::ffn)
      .def_rw("eps", &models::TransformerConfig::eps)
      .def_rw("causal", &models::TransformerConfig::causal)
      .def_rw("pre_norm", &models::TransformerConfig::pre_norm);
  models.def(
      "transformer_layer",
      [](const models::TransformerConfig& c, const std::string& name) {
        return value_or_raise(models::transformer_layer(c, name));
      },
      nb::arg("config"), nb::arg("name") = "transformer_layer");
  models.def("transformer_layer_input_shapes", &models::transformer_layer_input_shapes,
             nb::arg("config"), nb::arg("batch"), nb::arg("seq"));
}

}  // namespace dvm::python
