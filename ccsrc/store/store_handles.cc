#include "store/store_handles.h"

#include <mutex>
#include <unordered_map>
#include <utility>

namespace mshyper::store {
namespace {

std::mutex g_mu;
uint64_t g_next = 1;  // guarded by g_mu
std::unordered_map<uint64_t, std::shared_ptr<TensorStore>>& Stores() {  // guarded by g_mu
  static std::unordered_map<uint64_t, std::shared_ptr<TensorStore>> stores;
  return stores;
}

}  // namespace

uint64_t RegisterTensorStore(std::shared_ptr<TensorStore> store) {
  if (!store) throw StoreError("RegisterTensorStore needs a TensorStore");
  std::lock_guard<std::mutex> g(g_mu);
  const uint64_t handle = g_next++;
  Stores().emplace(handle, std::move(store));
  return handle;
}

void ReleaseTensorStore(uint64_t handle) {
  std::shared_ptr<TensorStore> old;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = Stores().find(handle);
    if (it == Stores().end()) return;
    old = std::move(it->second);
    Stores().erase(it);
  }
}  // `old` released outside the lock

std::shared_ptr<TensorStore> FindTensorStore(uint64_t handle) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = Stores().find(handle);
  return it == Stores().end() ? nullptr : it->second;
}

}  // namespace mshyper::store
