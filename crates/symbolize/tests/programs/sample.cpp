// A C++ function whose symbol is mangled, for the demangling test. The
// comment "line: NAME" marks the line the test expects.
#include "report.h"

namespace shapes {
template <typename T>
struct Box {
    T width;
};

template <typename T>
__attribute__((noipa)) T scaled_area(const Box<T> &box, T factor) {
    return box.width * box.width * factor; // line: scaled_area_body
}
}  // namespace shapes

int main() {
    shapes::Box<double> box{2.0};
    report_modules();
    report_address("scaled_area", reinterpret_cast<const void *>(&shapes::scaled_area<double>));
    return shapes::scaled_area(box, 1.0) > 0 ? 0 : 1;
}
