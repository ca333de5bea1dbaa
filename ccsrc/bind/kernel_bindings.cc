// Python bindings of the kernels' host side: kernel fences and tensor mailboxes. Waits release
// the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>
#include <vector>

#include "bind/arg_helpers.h"
#include "bind/bindings.h"
#include "kernels/kernel_fence.h"
#include "kernels/tensor_mailbox.h"

namespace py = pybind11;

namespace mshyper::bind {

void BindKernels(py::module_& m) {
  m.def("fence_new_id", &kernels::FenceNewId, "A fresh kernel-fence id (see ops.KernelFence).");
  m.def("fence_signal", &kernels::FenceSignal, py::arg("id"), "Marks a fence as passed (what the kernel does).");
  m.def("fence_poll", &kernels::FencePoll, py::arg("id"), "True (and forgotten) if the fence has passed.");
  m.def("fence_wait", [](uint64_t id, double timeout_s) {
          CheckTimeoutArg(timeout_s);
          py::gil_scoped_release release;
          return kernels::FenceWait(id, timeout_s);
        }, py::arg("id"), py::arg("timeout_s"),
        "Blocks (no spinning, GIL released) up to timeout_s for the fence; True (and forgotten) if it passed.");
  m.def("fence_forget", &kernels::FenceForget, py::arg("id"), "Abandons a fence.");
  m.def("fence_pending", &kernels::FencePending,
        "Fences passed but not consumed, plus those forgotten before they passed (a leak check).");

  m.def("mailbox_new_id", &kernels::MailboxNewId, "A fresh tensor-mailbox id (see offload.TensorCopyOut).");
  m.def("mailbox_deliver", [](uint64_t id, py::buffer data) {
          py::buffer_info info;
          const ConstBytes b = BytesOf(data, info, "mailbox_deliver: data");
          py::gil_scoped_release release;
          kernels::MailboxDeliver(id, b.ptr, static_cast<size_t>(b.len));
        }, py::arg("id"), py::arg("data"),
        "Delivers a copy of `data`'s bytes (what the kernel does); `data` must be C-contiguous (ValueError).");
  m.def("mailbox_take", [](uint64_t id, double timeout_s) -> py::object {
          CheckTimeoutArg(timeout_s);
          std::vector<uint8_t> bytes;
          bool delivered;
          {
            py::gil_scoped_release release;
            delivered = kernels::MailboxTake(id, timeout_s, &bytes);
          }
          if (!delivered) return py::none();
          auto* owned = new std::vector<uint8_t>(std::move(bytes));
          py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
          return py::array_t<uint8_t>({static_cast<py::ssize_t>(owned->size())}, {1}, owned->data(), owner);
        }, py::arg("id"), py::arg("timeout_s"),
        "Waits (GIL released) up to timeout_s for the mailbox: its bytes as a uint8 array (no copy), or None.");
  m.def("mailbox_forget", &kernels::MailboxForget, py::arg("id"), "Abandons a mailbox.");
  m.def("mailbox_pending", &kernels::MailboxPending,
        "Mailboxes delivered but not taken, plus those forgotten before delivery (a leak check).");
}

}  // namespace mshyper::bind
