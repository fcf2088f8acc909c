"""The C++ binding msda_mm compiles around mmcv's CUDA MSDA functions
(``ms_deform_attn_cuda_forward/backward`` of mmcv's
pytorch/cuda/ms_deform_attn_cuda.cu): a Python module with mmcv._ext's two
MSDA entry points."""

# mmcv's own binding (pytorch/ms_deform_attn.cpp, pybind.cpp) is device
# dispatch around these two; this one keeps its names, argument names and
# device guard, so mmcv's Function calls it as it calls mmcv._ext.
BINDING = r"""
#include <torch/extension.h>

at::Tensor ms_deform_attn_cuda_forward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const int im2col_step);

void ms_deform_attn_cuda_backward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const at::Tensor &grad_output,
    at::Tensor &grad_value, at::Tensor &grad_sampling_loc,
    at::Tensor &grad_attn_weight, const int im2col_step);

static at::Tensor forward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const int im2col_step) {
  at::DeviceGuard guard(value.device());
  return ms_deform_attn_cuda_forward(value, spatial_shapes, level_start_index,
                                     sampling_loc, attn_weight, im2col_step);
}

static void backward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const at::Tensor &grad_output,
    at::Tensor &grad_value, at::Tensor &grad_sampling_loc,
    at::Tensor &grad_attn_weight, const int im2col_step) {
  at::DeviceGuard guard(value.device());
  ms_deform_attn_cuda_backward(value, spatial_shapes, level_start_index,
                               sampling_loc, attn_weight, grad_output,
                               grad_value, grad_sampling_loc, grad_attn_weight,
                               im2col_step);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ms_deform_attn_forward", &forward, py::arg("value"),
        py::arg("value_spatial_shapes"), py::arg("value_level_start_index"),
        py::arg("sampling_locations"), py::arg("attention_weights"),
        py::arg("im2col_step"));
  m.def("ms_deform_attn_backward", &backward, py::arg("value"),
        py::arg("value_spatial_shapes"), py::arg("value_level_start_index"),
        py::arg("sampling_locations"), py::arg("attention_weights"),
        py::arg("grad_output"), py::arg("grad_value"),
        py::arg("grad_sampling_loc"), py::arg("grad_attn_weight"),
        py::arg("im2col_step"));
}
"""

