#pragma once
// A first-in first-out queue that holds no memory while it is empty. std::deque (libstdc++)
// allocates a map and a 512-byte block when it is constructed and keeps one block when drained:
// about 600 bytes for each of a connection's two queues, which idle sockets mostly leave empty.
#include <cstddef>
#include <utility>
#include <vector>

namespace outlive::ws {

template <class T>
class Fifo {
 public:
  using iterator = typename std::vector<T>::iterator;
  using const_iterator = typename std::vector<T>::const_iterator;
  using reverse_iterator = typename std::vector<T>::reverse_iterator;

  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  T& front() { return items_[head_]; }
  const T& front() const { return items_[head_]; }
  T& back() { return items_.back(); }

  // Invalidates references into the queue (a vector underneath).
  void push_back(T item) { items_.push_back(std::move(item)); }
  void pop_front() {
    items_[head_] = T();  // what the element holds goes now, not at the next compaction
    if (++head_ == items_.size()) return clear();
    // Taken elements are reclaimed once they are the larger half: O(1) amortised.
    if (head_ * 2 >= items_.size() && head_ >= 16) {
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void pop_back() {
    items_.pop_back();
    if (empty()) clear();
  }
  // Gives the memory back: a drained queue of an idle socket costs nothing.
  void clear() {
    std::vector<T>().swap(items_);
    head_ = 0;
  }

  iterator begin() { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  const_iterator end() const { return items_.end(); }
  reverse_iterator rbegin() { return items_.rbegin(); }
  reverse_iterator rend() { return items_.rend() - static_cast<std::ptrdiff_t>(head_); }

 private:
  std::vector<T> items_;
  size_t head_ = 0;
};

}  // namespace outlive::ws
