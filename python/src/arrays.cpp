#include "arrays.h"

#include <stdexcept>
#include <string>

#include "kernels/dtype.h"

namespace moe::py_api {

namespace {

std::string shape_text(py::handle shape) {
  std::string s = "[";
  bool first = true;
  for (py::handle d : shape) {
    s += (first ? "" : ", ") + std::string(py::str(d));
    first = false;
  }
  return s + "]";
}

std::string expected(const char* what, int64_t hidden) {
  return std::string(what) + " [tokens, " + std::to_string(hidden) + "]";
}

[[noreturn]] void fail(const char* arg, const std::string& expect, const std::string& got) {
  throw std::invalid_argument(std::string(arg) + ": expected " + expect + ", got " + got);
}

// "float64 [3, 2048]" for an array or a tensor.
std::string describe_array(const py::array& a) {
  return std::string(py::str(a.dtype())) + " " + shape_text(a.attr("shape"));
}
std::string tensor_dtype(py::handle t) {
  std::string d = py::str(t.attr("dtype"));
  return d.rfind("torch.", 0) == 0 ? d.substr(6) : d;
}
std::string describe_tensor(py::handle t) { return tensor_dtype(t) + " " + shape_text(t.attr("shape")); }

// A NumPy array's checks; `tokens` < 0: any row count.
const void* check_array(const py::array& a, int64_t tokens, int64_t hidden, bool write, const char* arg) {
  const std::string want = tokens < 0 ? expected("float32", hidden)
                                      : "float32 [" + std::to_string(tokens) + ", " + std::to_string(hidden) + "]";
  if (!a.dtype().is(py::dtype::of<float>()) || a.ndim() != 2 || a.shape(1) != hidden ||
      (tokens >= 0 && a.shape(0) != tokens))
    fail(arg, want, describe_array(a));
  const int flags = py::detail::array_proxy(a.ptr())->flags;
  if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
    fail(arg, "a C-contiguous " + want + " array",
         "a non-contiguous one (strides " + std::string(py::str(a.attr("strides"))) +
             " bytes; np.ascontiguousarray copies it)");
  if (!(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) fail(arg, "an aligned " + want + " array", "a misaligned one");
  if (write && !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_))
    fail(arg, "a writeable " + want + " array", "a read-only one");
  return a.data();
}

// A tensor's checks (dtype checked by the caller); returns data_ptr().
uintptr_t check_tensor(py::handle t, int64_t tokens, int64_t hidden, const std::string& want, const char* arg) {
  const std::string device = py::str(t.attr("device").attr("type"));
  if (device != "cpu") fail(arg, "a CPU tensor", "one on device " + std::string(py::str(t.attr("device"))));
  py::tuple shape = t.attr("shape");
  if (shape.size() != 2 || shape[1].cast<int64_t>() != hidden || (tokens >= 0 && shape[0].cast<int64_t>() != tokens))
    fail(arg, want, describe_tensor(t));
  if (!t.attr("is_contiguous")().cast<bool>())
    fail(arg, "a contiguous " + want + " tensor",
         "a non-contiguous one (stride " + std::string(py::str(t.attr("stride")())) + "; .contiguous() copies it)");
  return t.attr("data_ptr")().cast<uintptr_t>();
}

}  // namespace

const TorchTypes* torch_types() {
  static const TorchTypes* types = [] {
    try {
      py::module_ torch = py::module_::import("torch");
      return new TorchTypes{torch.attr("Tensor"), torch.attr("float32"), torch.attr("bfloat16"), torch.attr("uint8"),
                            torch.attr("empty")};  // never freed: outlives every call
    } catch (const py::error_already_set&) {
      return static_cast<TorchTypes*>(nullptr);
    }
  }();
  return types;
}

bool is_tensor(py::handle obj) {
  // Only where torch is already imported: whoever holds a tensor has imported it, and importing it here for
  // a wrong argument would take a second.
  if (!PyDict_Contains(PyImport_GetModuleDict(), py::str("torch").ptr())) return false;
  const TorchTypes* t = torch_types();
  return t != nullptr && py::isinstance(obj, t->tensor);
}

py::array_t<float> new_float_array(int64_t rows, int64_t cols) {
  return py::array_t<float>({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
}

void Input::convert() const {
  if (bf16 == nullptr) return;
  float* dst = const_cast<float*>(data);
  const size_t n = static_cast<size_t>(tokens * hidden);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(bf16[i]);
}

Input resolve_input(py::handle x, int64_t hidden, const char* arg) {
  Input in;
  in.owner = py::reinterpret_borrow<py::object>(x);
  in.hidden = hidden;
  if (py::isinstance<py::array>(x)) {
    auto a = py::reinterpret_borrow<py::array>(x);
    in.data = static_cast<const float*>(check_array(a, -1, hidden, false, arg));
    in.tokens = a.shape(0);
    return in;
  }
  if (!is_tensor(x))
    fail(arg, "a NumPy array or a torch.Tensor, float32 [tokens, " + std::to_string(hidden) + "]",
         "an object of type " + std::string(py::str(x.get_type().attr("__name__"))));
  const TorchTypes& t = *torch_types();
  in.torch = true;
  py::object dtype = x.attr("dtype");
  const bool bf16 = dtype.is(t.bfloat16);
  if (!bf16 && !dtype.is(t.float32)) fail(arg, expected("float32 (or bfloat16)", hidden), describe_tensor(x));
  const uintptr_t p = check_tensor(x, -1, hidden, expected(bf16 ? "bfloat16" : "float32", hidden), arg);
  in.tokens = py::tuple(x.attr("shape"))[0].cast<int64_t>();
  if (bf16) {
    in.bf16 = reinterpret_cast<const uint16_t*>(p);
    py::array_t<float> buf = new_float_array(in.tokens, hidden);
    in.data = buf.data();
    in.buffer = std::move(buf);
  } else {
    if (p % alignof(float) != 0) fail(arg, "an aligned tensor", "a misaligned one");
    in.data = reinterpret_cast<const float*>(p);
  }
  return in;
}

Output resolve_output(py::handle out, const Input& in, int64_t hidden, const char* arg) {
  Output o;
  if (out.is_none()) {
    if (in.torch) {
      const TorchTypes& t = *torch_types();
      o.owner = t.empty(in.tokens, hidden, py::arg("dtype") = t.float32);
      o.data = reinterpret_cast<float*>(o.owner.attr("data_ptr")().cast<uintptr_t>());
    } else {
      py::array_t<float> a = new_float_array(in.tokens, hidden);
      o.data = a.mutable_data();
      o.owner = std::move(a);
    }
    return o;
  }
  o.owner = py::reinterpret_borrow<py::object>(out);
  const std::string want = "float32 [" + std::to_string(in.tokens) + ", " + std::to_string(hidden) + "]";
  if (py::isinstance<py::array>(out)) {
    o.data = static_cast<float*>(const_cast<void*>(check_array(py::reinterpret_borrow<py::array>(out), in.tokens,
                                                               hidden, true, arg)));
  } else if (is_tensor(out)) {
    if (!py::object(out.attr("dtype")).is(torch_types()->float32)) fail(arg, want, describe_tensor(out));
    const uintptr_t p = check_tensor(out, in.tokens, hidden, want, arg);
    if (p % alignof(float) != 0) fail(arg, "an aligned tensor", "a misaligned one");
    o.data = reinterpret_cast<float*>(p);
  } else {
    fail(arg, "a NumPy array or a torch.Tensor, " + want,
         "an object of type " + std::string(py::str(out.get_type().attr("__name__"))));
  }
  const size_t n = static_cast<size_t>(in.tokens * hidden);
  if (n > 0 && o.data < in.data + n && in.data < o.data + n)
    throw std::invalid_argument(std::string(arg) + ": overlaps x (the layer never writes its input; pass another buffer)");
  return o;
}

}  // namespace moe::py_api
