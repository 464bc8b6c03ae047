module specread

go 1.19
